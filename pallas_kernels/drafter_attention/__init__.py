"""The DFlash drafter's block attention (operation "drafter_attention").

The drafter runs its b block slots (the pending token and b-1 masks) as one bidirectional block:
per query head, every slot attends to its stream's context (the drafter's context cache: slots
< ctx_lengths[s] hold it) and to all b slots of the block. Grouped-query: query head h reads KV
head h // (H / KV). Shapes: q [B, b, H, hd], ctx_k / ctx_v [B, KV, N, hd] (head-major cache),
ctx_lengths [B] int (0..N), k_blk / v_blk [B, b, KV, hd] -> float32 [B, b, H, hd]; softmax in
float32 with `scale`. Implementations: "xla" (einsums and one softmax), "pallas_triton" (programs
over stream, KV head and context split, walking only the visible tiles).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels import registry
from pallas_kernels.drafter_attention import pallas_triton, xla  # noqa: F401  (registers impls)

__all__ = ["drafter_attention"]


def _validate(q, ctx_k, ctx_v, ctx_lengths, k_blk, v_blk) -> None:
    if q.ndim != 4:
        raise ValueError(f"q must be [B, b, H, hd]; got shape {q.shape}")
    bsz, b, h, hd = q.shape
    if ctx_k.ndim != 4 or ctx_k.shape[0] != bsz or ctx_k.shape[3] != hd:
        raise ValueError(f"ctx_k must be [B={bsz}, KV, N, hd={hd}]; got shape {ctx_k.shape}")
    kvh, n = ctx_k.shape[1], ctx_k.shape[2]
    if h % kvh:
        raise ValueError(f"q's {h} heads are not a multiple of ctx_k's {kvh} KV heads")
    if ctx_v.shape != ctx_k.shape:
        raise ValueError(f"ctx_v must have ctx_k's shape {ctx_k.shape}; got {ctx_v.shape}")
    if ctx_lengths.shape != (bsz,) or not jnp.issubdtype(ctx_lengths.dtype, jnp.integer):
        raise ValueError(f"ctx_lengths must be integer [B={bsz}]; got {ctx_lengths.dtype} "
                         f"shape {ctx_lengths.shape}")
    for name, x in (("k_blk", k_blk), ("v_blk", v_blk)):
        if x.shape != (bsz, b, kvh, hd):
            raise ValueError(f"{name} must be [B={bsz}, b={b}, KV={kvh}, hd={hd}]; got shape {x.shape}")


def drafter_attention(q, ctx_k, ctx_v, ctx_lengths, k_blk, v_blk, *, scale: float,
                      impl: str = "auto") -> jax.Array:
    """See the module docstring; `impl` picks the implementation ("auto": by backend)."""
    _validate(q, ctx_k, ctx_v, ctx_lengths, k_blk, v_blk)
    return registry.get("drafter_attention", impl)(q, ctx_k, ctx_v, ctx_lengths, k_blk, v_blk,
                                                   scale=scale)
