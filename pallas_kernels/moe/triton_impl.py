"""The "triton" implementation of moe_experts: raw Triton kernels through jax_triton.triton_call.

Same algorithm as pallas_triton.py (gate_up with the SiLU epilogue, down with the row weight,
per-token combine in XLA), with h and y in row layout ([R, .], padding rows unwritten) where
pallas_triton's are in slot layout; the route that survives Pallas:Triton's removal. GPU only:
the kernels (_triton_kernels.py) and jax_triton are imported on first use (jax-triton raises on
import without a GPU jaxlib).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels import registry
from pallas_kernels.moe import int4, tuning
from pallas_kernels.moe.experts import check_moe_inputs, dims as expert_dims
from pallas_kernels.moe.align import align_routing
from pallas_kernels.moe.pallas_triton import _col_block
from pallas_kernels.moe.xla import combine


@functools.cache
def _kernels():
    from pallas_kernels.moe import _triton_kernels as tk
    return tk.gate_up, tk.down


def routed_rows(topk_ids, topk_weights, num_experts: int, bm: int):
    """Align the routing: (routing, row_token [R] int32 (-1: a padding row), row_weight [R]
    float32 (0 on padding rows))."""
    t, k = topk_ids.shape
    r = align_routing(topk_ids, num_experts, bm)
    row_token = jnp.where(r.row_slot < t * k, r.row_slot // k, -1)
    w_slot = jnp.concatenate([topk_weights.reshape(-1).astype(jnp.float32), jnp.zeros((1,))])
    return r, row_token, w_slot[r.row_slot]


def _weights(experts, name, int4_weights):
    if int4_weights:
        return [experts[f"{name}_qweight"], experts[f"{name}_qscale"]]
    w = experts[f"{name}_kernel"]
    return [w, w]          # the scale pointer is unused for bf16 weights


@functools.partial(jax.jit, static_argnames=("cfg",))
def moe_experts_triton(x, topk_ids, topk_weights, experts, *, cfg: tuning.MoEConfig | None = None):
    """x [T, d], topk_ids [T, k], topk_weights [T, k], experts -> [T, d] x.dtype (GPU only)."""
    import jax_triton as jt

    dm = check_moe_inputs(x, topk_ids, topk_weights, experts)
    if why := supports(x, topk_ids, topk_weights, experts):
        raise ValueError(f"experts: {why}")
    cfg = cfg or tuning.config(x.shape[0])
    gate_up_k, down_k = _kernels()
    r, row_token, row_weight = routed_rows(topk_ids, topk_weights, dm.num_experts, cfg.bm)
    rows, nb = r.row_slot.shape[0], r.block_expert.shape[0]
    asm = cfg.dequant == "asm" and x.dtype == jnp.bfloat16
    common = dict(BM=cfg.bm, INT4=dm.int4, ASM=asm)
    tune_up = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    tune_down = dict(num_warps=cfg.down_warps or cfg.num_warps,
                     num_stages=cfg.down_stages or cfg.num_stages)
    bn = _col_block(dm.intermediate, cfg.bn_up)
    kw_up = int4.padded_k(dm.hidden) // 8 if dm.int4 else dm.hidden
    h = jt.triton_call(
        jnp.maximum(row_token, 0), r.block_expert, x, *_weights(experts, "gate", dm.int4),
        *_weights(experts, "up", dm.int4), kernel=gate_up_k,
        out_shape=jax.ShapeDtypeStruct((rows, dm.intermediate), x.dtype),
        grid=(nb, dm.intermediate // bn), D=dm.hidden, N=dm.intermediate, KW=kw_up, BN=bn, **common,
        **tune_up)
    bn = _col_block(dm.hidden, cfg.bn_down)
    kw_down = int4.padded_k(dm.intermediate) // 8 if dm.int4 else dm.intermediate
    y = jt.triton_call(
        row_weight, r.block_expert, h, *_weights(experts, "down", dm.int4), kernel=down_k,
        out_shape=jax.ShapeDtypeStruct((rows, dm.hidden), jnp.float32),
        grid=(nb, dm.hidden // bn), I=dm.intermediate, N=dm.hidden, KW=kw_down, BN=bn, **common,
        **tune_down)
    return combine(y, r.slot_row, *topk_ids.shape, x.dtype)


def supports(x, topk_ids, topk_weights, experts) -> str | None:
    """Why the registered "triton" implementation cannot take these experts, or None."""
    dm = expert_dims(experts)
    if not dm.int4 and (dm.hidden % 32 or dm.intermediate % 32):
        return f"the triton kernels need bf16 experts' d ({dm.hidden}) and I ({dm.intermediate}) to be multiples of 32"
    return None


registry.register("moe_experts", "triton", supports=supports)(
    lambda x, topk_ids, topk_weights, experts: moe_experts_triton(x, topk_ids, topk_weights, experts))
