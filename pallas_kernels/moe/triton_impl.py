"""The "triton" implementation of moe_experts: raw Triton kernels through jax_triton.triton_call.

The route that survives Pallas:Triton's removal, so it follows pallas_triton.py's design:
`gate_up` and `down` take the same arguments as that module's, write h and y in slot layout
([T*k, .]), load and store real rows only, apply the group scale as the tuned table says
(`scale_weights`), run a block's smallest row prefix holding its real rows (`min_bm`) and
multiply in float16 for INT4 experts with float16 scales; the routing alignment, the float16 row
scaling and the per-token sum are `pallas_triton.slot_experts`. The Pallas-only variants
(split_k, swap_ab, cols_first) are ignored. GPU only: the kernels (_triton_kernels.py) and
jax_triton are imported on first use (jax-triton raises on import without a GPU jaxlib).
"""

from __future__ import annotations

import functools
import importlib.util
from typing import NamedTuple

import jax
import jax.numpy as jnp

from pallas_kernels import registry
from pallas_kernels.moe import int4, tuning
from pallas_kernels.moe.experts import Dims, check_moe_inputs, dims as expert_dims
from pallas_kernels.moe.pallas_triton import col_block, slot_experts


@functools.cache
def _kernels():
    from pallas_kernels.moe import _triton_kernels
    return _triton_kernels


def _weights(experts, name, int4_weights):
    if int4_weights:
        return [experts[f"{name}_qweight"], experts[f"{name}_qscale"]]
    w = experts[f"{name}_kernel"]
    return [w, w]          # the scale pointer is unused for bf16 weights


class Launch(NamedTuple):
    """One raw Triton kernel call: `kernel` ("gate_up" / "down" of _triton_kernels), its inputs
    (arrays, or ShapeDtypeStructs for offline compiles: experiments/ptx_stats.py --kernel=moe_triton),
    the output, grid, warps, stages and constexprs."""
    kernel: str
    args: list
    out_shape: jax.ShapeDtypeStruct
    grid: tuple
    num_warps: int
    num_stages: int
    constants: dict


def _asm(cfg, dtype) -> bool:
    """PTX dequantisation (the kernels only ever run compiled, on a GPU). These kernels ignore
    swap_ab, so a 64-row block with it is refused as MoEConfig.check refuses it without."""
    if cfg.dequant == "asm" and cfg.bm >= 64:
        raise ValueError(f"MoEConfig.dequant='asm' needs bm <= 32 in the raw Triton kernels (they ignore "
                         f"swap_ab), got bm={cfg.bm}; use dequant='bits'")
    return cfg.dequant == "asm" and dtype in (jnp.bfloat16, jnp.float16)


def gate_up_launch(x, row_slot, block_expert, experts, dm: Dims, cfg, top_k: int, row_scale=None) -> Launch:
    bn = col_block(dm.intermediate, cfg.check().bn_up)
    scaled = row_scale is not None
    slots = x.shape[0] * top_k
    args = [row_slot, block_expert, x, row_scale if scaled else x,
            *_weights(experts, "gate", dm.int4), *_weights(experts, "up", dm.int4)]
    shape = jax.ShapeDtypeStruct((slots, dm.intermediate), jnp.float32 if scaled else x.dtype)
    return Launch("gate_up", args, shape, (block_expert.shape[0], dm.intermediate // bn), cfg.num_warps,
                  cfg.num_stages, dict(D=dm.hidden, N=dm.intermediate,
                                       KW=int4.padded_k(dm.hidden) // 8 if dm.int4 else dm.hidden, TOP_K=top_k,
                                       NUM_SLOTS=slots, BM=cfg.bm, MIN_BM=cfg.min_bm, BN=bn, INT4=dm.int4,
                                       ASM=_asm(cfg, x.dtype),
                                       SCALE_W=dm.int4 and cfg.scale_weights, SCALED=scaled))


def down_launch(h, row_slot, slot_weight, block_expert, experts, dm: Dims, cfg) -> Launch:
    bn = col_block(dm.hidden, cfg.check().bn_down)
    args = [row_slot, slot_weight, block_expert, h, *_weights(experts, "down", dm.int4)]
    shape = jax.ShapeDtypeStruct((h.shape[0], dm.hidden), jnp.float32)
    return Launch("down", args, shape, (block_expert.shape[0], dm.hidden // bn), cfg.down_warps or cfg.num_warps,
                  cfg.down_stages or cfg.num_stages,
                  dict(I=dm.intermediate, N=dm.hidden,
                       KW=int4.padded_k(dm.intermediate) // 8 if dm.int4 else dm.intermediate,
                       NUM_SLOTS=h.shape[0], BM=cfg.bm, MIN_BM=cfg.min_bm, BN=bn, INT4=dm.int4,
                       ASM=_asm(cfg, h.dtype),
                       SCALE_W=dm.int4 and cfg.scale_weights))


def _call(launch: Launch, out=None):
    """jax_triton.triton_call of a Launch, into `out` when given (aliased; the kernel's
    `into_ptr`, otherwise handed args[0] and never read)."""
    import jax_triton as jt

    args = launch.args
    into = args[0] if out is None else out
    aliases = {} if out is None else {len(args): 0}
    return jt.triton_call(*args, into, kernel=getattr(_kernels(), launch.kernel), out_shape=launch.out_shape,
                          grid=launch.grid, input_output_aliases=aliases, num_warps=launch.num_warps,
                          num_stages=launch.num_stages, **launch.constants)


def gate_up(x, row_slot, block_expert, experts, dm: Dims, cfg, top_k: int, out=None, row_scale=None):
    """h [T*k, I] in slot layout, as `pallas_triton.gate_up` (without split_k)."""
    return _call(gate_up_launch(x, row_slot, block_expert, experts, dm, cfg, top_k, row_scale), out)


def down(h, row_slot, slot_weight, block_expert, experts, dm: Dims, cfg, out=None):
    """y [T*k, d] float32 in slot layout, as `pallas_triton.down` (without split_k)."""
    return _call(down_launch(h, row_slot, slot_weight, block_expert, experts, dm, cfg), out)


@functools.partial(jax.jit, static_argnames=("cfg",))
def moe_experts_triton(x, topk_ids, topk_weights, experts, valid=None, *,
                       cfg: tuning.MoEConfig | None = None):
    """x [T, d], topk_ids [T, k], topk_weights [T, k], experts, valid [T, k] bool or None -> [T, d]
    x.dtype (GPU only)."""
    dm = check_moe_inputs(x, topk_ids, topk_weights, experts, valid)
    if why := supports(x, topk_ids, topk_weights, experts):
        raise ValueError(f"experts: {why}")
    return slot_experts(x, topk_ids, topk_weights, experts, dm, cfg or tuning.config(x.shape[0]),
                        gate_up, down, valid)


def have_jax_triton() -> bool:
    """Whether jax-triton can be imported (it is not a dependency of this package)."""
    return importlib.util.find_spec("jax_triton") is not None


def supports(x, topk_ids, topk_weights, experts, valid=None) -> str | None:
    """Why the registered "triton" implementation cannot take this call, or None."""
    if not have_jax_triton():
        return "jax-triton is not installed (pip install jax-triton)"
    dm = expert_dims(experts)
    if not dm.int4 and (dm.hidden % 32 or dm.intermediate % 32):
        return f"the triton kernels need bf16 experts' d ({dm.hidden}) and I ({dm.intermediate}) to be multiples of 32"
    return None


registry.register("moe_experts", "triton", supports=supports)(
    lambda x, topk_ids, topk_weights, experts, valid=None: moe_experts_triton(
        x, topk_ids, topk_weights, experts, valid))
