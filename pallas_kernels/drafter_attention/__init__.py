"""The DFlash drafter's block attention (operation "drafter_attention").

The drafter runs its b block slots (the pending token and b-1 masks) as one bidirectional block:
per query head, every slot attends to its stream's context (the drafter's context cache: slots
< ctx_lengths[s] hold it) and to all b slots of the block. Grouped-query: query head h reads KV
head h // (H / KV). Shapes: q [B, b, H, hd], ctx_k / ctx_v [B, KV, N, hd] (head-major cache),
ctx_lengths [B] int (0..N), k_blk / v_blk [B, b, KV, hd] -> float32 [B, b, H, hd]; softmax in
float32 with `scale`. With `layer`, ctx_k / ctx_v are a stacked cache [L, B, KV, N, hd] and layer
`layer` is read (in place: the kernel reads the stack, where an XLA slice would copy it).
Implementations: "xla" (einsums and one softmax), "pallas_triton" (programs over stream, KV head
and context split, walking only the visible tiles). Design note: docs/kernels/drafter_attention.md.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels import registry
from pallas_kernels.checks import concrete
from pallas_kernels.drafter_attention import pallas_triton, xla  # noqa: F401  (registers impls)

__all__ = ["drafter_attention"]


def _validate(q, ctx_k, ctx_v, ctx_lengths, k_blk, v_blk, layer) -> None:
    if q.ndim != 4:
        raise ValueError(f"q must be [B, b, H, hd]; got shape {q.shape}")
    k_shape = tuple(ctx_k.shape)
    if layer is not None:
        if len(k_shape) != 5 or isinstance(layer, bool) or not isinstance(layer, int) \
                or not 0 <= layer < k_shape[0]:
            raise ValueError(f"with layer={layer!r}, ctx_k must be a stacked cache [L, B, KV, N, hd] "
                             f"with 0 <= layer < L; got shape {k_shape}")
        k_shape = k_shape[1:]
    bsz, b, h, hd = q.shape
    if len(k_shape) != 4 or k_shape[0] != bsz or k_shape[3] != hd:
        raise ValueError(f"ctx_k must be [B={bsz}, KV, N, hd={hd}]; got shape {ctx_k.shape}")
    kvh = k_shape[1]
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
    lens = concrete(ctx_lengths)
    if lens is not None and (lens.min(initial=0) < 0 or lens.max(initial=0) > k_shape[2]):
        raise ValueError(f"ctx_lengths must lie in [0, N={k_shape[2]}]; got {lens.tolist()}")


def drafter_attention(q, ctx_k, ctx_v, ctx_lengths, k_blk, v_blk, *, scale: float,
                      layer: int | None = None, impl: str = "auto") -> jax.Array:
    """See the module docstring; `impl` picks the implementation ("auto": by backend)."""
    _validate(q, ctx_k, ctx_v, ctx_lengths, k_blk, v_blk, layer)
    return registry.get("drafter_attention", impl)(q, ctx_k, ctx_v, ctx_lengths, k_blk, v_blk,
                                                   scale=scale, layer=layer)
