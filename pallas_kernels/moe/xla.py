"""The "xla" implementation of moe_experts: pure JAX, runs on every backend.

Slots are aligned by expert (align.py) and a scan walks the row blocks: each block gathers its
tokens, dequantises its one expert, runs gate/up -> SiLU(gate)*up -> down, and scales by the routing
weight; blocks of expert -1 (unused, or only dropped slots') are skipped. Per-slot results [R, d]
are then summed per token in float32, a dropped slot adding 0. Nothing of size
[T, E, ...] is ever built; each step holds one expert's weights.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels import registry
from pallas_kernels.moe import int4
from pallas_kernels.moe.align import align_routing
from pallas_kernels.moe.experts import check_moe_inputs


def _block_m(num_slots: int, num_experts: int) -> int:
    """Rows per block: about the mean slots per expert, a power of two in [1, 128]."""
    mean = -(-num_slots // num_experts)
    return min(128, 1 << (mean - 1).bit_length())


def expert_weights(experts, e, dtype):
    """Expert e's (gate [d, I], up [d, I], down [I, d]) in `dtype` (int4 is dequantised)."""
    if "gate_kernel" in experts:
        return tuple(experts[f"{n}_kernel"][e].astype(dtype) for n in ("gate", "up", "down"))
    d = experts["down_qweight"].shape[-1]
    i = experts["gate_qweight"].shape[-1]
    w = {n: int4.dequantize_kernel_layout(experts[f"{n}_qweight"][e], experts[f"{n}_qscale"][e],
                                          dtype) for n in ("gate", "up", "down")}
    return w["gate"][:d], w["up"][:d], w["down"][:i]


def combine(y_rows, slot_row, num_tokens: int, top_k: int, dtype):
    """Per-row results y_rows [R, d] -> per-token sums over the top-k slots, [T, d] in `dtype`
    (slot_row R, a dropped slot: 0)."""
    y = y_rows.at[slot_row].get(mode="fill", fill_value=0).astype(jnp.float32)
    y = y.reshape(num_tokens, top_k, -1)
    return y.sum(axis=1).astype(dtype)


@registry.register("moe_experts", "xla")
@jax.jit
def moe_experts_xla(x, topk_ids, topk_weights, experts, valid=None):
    """x [T, d], topk_ids [T, k] int, topk_weights [T, k] float, experts dict, valid [T, k] bool or
    None -> [T, d] x.dtype."""
    dm = check_moe_inputs(x, topk_ids, topk_weights, experts, valid)
    t, k = topk_ids.shape
    bm = _block_m(t * k, dm.num_experts)
    r = align_routing(topk_ids, dm.num_experts, bm, valid)
    row_token = jnp.minimum(r.row_slot // k, t - 1).reshape(-1, bm)
    w_slot = jnp.concatenate([topk_weights.reshape(-1).astype(jnp.float32), jnp.zeros((1,))])
    row_weight = w_slot[r.row_slot].reshape(-1, bm)

    def block(_, inputs):
        e, tokens, weight = inputs

        def run():
            wg, wu, wd = expert_weights(experts, e, x.dtype)
            xb = x[tokens]
            g = jnp.dot(xb, wg, preferred_element_type=jnp.float32)
            u = jnp.dot(xb, wu, preferred_element_type=jnp.float32)
            h = (jax.nn.silu(g) * u).astype(x.dtype)
            return jnp.dot(h, wd, preferred_element_type=jnp.float32) * weight[:, None]

        y = jax.lax.cond(e >= 0, run, lambda: jnp.zeros((bm, dm.hidden), jnp.float32))
        return None, y

    _, y = jax.lax.scan(block, None, (r.block_expert, row_token, row_weight))
    return combine(y.reshape(-1, dm.hidden), r.slot_row, t, k, x.dtype)
