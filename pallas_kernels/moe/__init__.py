"""Routed-expert MoE (operation "moe_experts"): INT4 W4A16 or bf16 grouped GEMMs.

Implementations: "xla" (xla.py), "pallas_triton" (pallas_triton.py), "triton" (triton_impl.py,
jax-triton, GPU only; what "auto" takes on a GPU where jax-triton is installed, else
"pallas_triton"). See docs/INTERFACES.md, section "pallas_kernels.moe", and the design note
docs/kernels/moe.md.
"""

from __future__ import annotations

from pallas_kernels import registry
from pallas_kernels.moe import pallas_triton, triton_impl, xla  # noqa: F401  (registers impls)
from pallas_kernels.moe.align import Routing, align_routing, max_blocks
from pallas_kernels.moe.experts import (check_moe_inputs, dims, experts_to_hf, prepare_experts_bf16,
                                        prepare_experts_int4)
from pallas_kernels.moe.int4 import dequantize_int4, quantize_int4

__all__ = ["moe_experts", "prepare_experts_bf16", "prepare_experts_int4", "experts_to_hf",
           "quantize_int4", "dequantize_int4", "align_routing", "Routing", "max_blocks", "dims"]


@registry.chooser("moe_experts")
def _prefer_triton(x, topk_ids, topk_weights, experts, valid=None) -> str:
    """impl="auto" on a GPU: the raw Triton kernels (level with or ahead of the Pallas kernels:
    docs/kernels/moe.md). Where jax-triton is missing or their `supports` rule refuses, the
    registry falls back to "pallas_triton"."""
    return "triton"


def moe_experts(x, topk_ids, topk_weights, experts, valid=None, *, impl: str = "auto"):
    """x [T, d], topk_ids [T, k] int32, topk_weights [T, k] float32, experts dict, valid [T, k] bool
    or None (every slot) -> [T, d] x.dtype:
    sum over the valid j of topk_weights[t, j] * down(silu(gate(x[t])) * up(x[t])) with expert
    topk_ids[t, j]. An invalid slot takes no row and no block of the grouped GEMMs (no kernel
    computes it); a token with no valid slot gets 0."""
    check_moe_inputs(x, topk_ids, topk_weights, experts, valid)   # eagerly: the ids' range too, when known
    return registry.get("moe_experts", impl)(x, topk_ids, topk_weights, experts, valid)
