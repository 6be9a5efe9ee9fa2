"""The DFlash drafter's attention inputs (operation "drafter_qkv"): one fused projection.

    drafter_qkv(x [B, T, d], positions [B, T] int, wq [d, H*hd] or None, wk, wv [d, KV*hd],
                q_norm [hd] or None, k_norm [hd], inv_freq [hd/2], *, norm [d] or None, eps)
        -> (q [B, T, H, hd] or None, k [B, T, KV, hd], v [B, T, KV, hd]), all in x's dtype

with h = RMSNorm(x; norm) (h = x when norm is None), q = RoPE(RMSNorm_head(h @ wq; q_norm)),
k = RoPE(RMSNorm_head(h @ wk; k_norm)), v = h @ wv. RMSNorms are in float32 (y = scale * x /
sqrt(mean(x^2) + eps)); RoPE (Qwen3's rotate-half) turns the pair (i, i + hd/2) by the angle
positions * inv_freq[i], formed and applied in float32. Products in x's dtype with float32
accumulation; every intermediate is rounded to x's dtype where the module form (Linear, RMSNorm,
RoPE one after another) rounds it. The drafter's block (norm = its input_layernorm) and its
context (norm = hidden_norm, no q) both go through it. Implementations: "xla" (the module math as
XLA ops), "pallas_triton" (one kernel: programs over row blocks x output heads, each normalising
its rows, projecting one head's two halves, and writing q/k/v in the drafter attention's layout).
Design note: docs/kernels/drafter_attention.md.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from pallas_kernels import registry
from pallas_kernels.drafter_qkv import pallas_triton, xla  # noqa: F401  (registers impls)

__all__ = ["drafter_qkv"]


def _check(name: str, x, shape: tuple) -> None:
    if x is None or tuple(x.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}; got "
                         f"{None if x is None else list(x.shape)}")


def _validate(x, positions, wq, wk, wv, q_norm, k_norm, inv_freq, norm) -> None:
    if getattr(x, "ndim", None) != 3:
        raise ValueError(f"x must be [B, T, d]; got shape {getattr(x, 'shape', None)}")
    bsz, t, d = x.shape
    if getattr(positions, "shape", None) != (bsz, t) or not jnp.issubdtype(positions.dtype, jnp.integer):
        raise ValueError(f"positions must be integer [B={bsz}, T={t}]; got "
                         f"{getattr(positions, 'dtype', None)} {getattr(positions, 'shape', None)}")
    if getattr(k_norm, "ndim", None) != 1 or k_norm.shape[0] % 2:
        raise ValueError(f"k_norm must be [hd] with hd even; got {getattr(k_norm, 'shape', None)}")
    hd = k_norm.shape[0]
    if getattr(wk, "ndim", None) != 2 or wk.shape[0] != d or wk.shape[1] % hd:
        raise ValueError(f"wk must be [d={d}, KV*hd] with hd={hd}; got {getattr(wk, 'shape', None)}")
    _check("wv", wv, tuple(wk.shape))
    _check("inv_freq", inv_freq, (hd // 2,))
    if norm is not None:
        _check("norm", norm, (d,))
    if (wq is None) != (q_norm is None):
        raise ValueError("wq and q_norm must be given together (or neither, for k and v only)")
    if wq is not None:
        if wq.ndim != 2 or wq.shape[0] != d or wq.shape[1] % hd:
            raise ValueError(f"wq must be [d={d}, H*hd] with hd={hd}; got {list(wq.shape)}")
        _check("q_norm", q_norm, (hd,))


def drafter_qkv(x, positions, wq, wk, wv, q_norm, k_norm, inv_freq, *, norm=None, eps: float,
                impl: str = "auto"):
    """See the module docstring; `impl` picks the implementation ("auto": by backend)."""
    inv_freq = jnp.asarray(np.asarray(inv_freq, np.float32))
    _validate(x, positions, wq, wk, wv, q_norm, k_norm, inv_freq, norm)
    return registry.get("drafter_qkv", impl)(x, positions, wq, wk, wv, q_norm, k_norm, inv_freq,
                                             norm=norm, eps=float(eps))
