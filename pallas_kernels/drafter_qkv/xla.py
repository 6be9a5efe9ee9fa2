"""Pure-JAX drafter_qkv: the drafter module's own sequence of ops (Linear, RMSNorm, and RoPE in the
Llama/Qwen "rotate_half" layout, `rotate_half`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels import registry


def rms_norm(x, scale, eps: float):
    """scale * x / sqrt(mean(x^2) + eps) over the last axis, in float32, cast back to x.dtype."""
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (y * scale.astype(jnp.float32)).astype(x.dtype)


def rotate_half(x, cos, sin):
    """Turn the pairs (x[i], x[i + hd/2]) by cos/sin [..., hd/2], in float32; x's dtype out."""
    x0, x1 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1).astype(x.dtype)


@registry.register("drafter_qkv", "xla")
def drafter_qkv_xla(x, positions, wq, wk, wv, q_norm, k_norm, inv_freq, *, norm, eps: float):
    """See the package docstring."""
    hd = k_norm.shape[0]
    h = x if norm is None else rms_norm(x, norm, eps)
    heads = lambda w: (h @ w.astype(h.dtype)).reshape(*h.shape[:-1], -1, hd)   # noqa: E731
    angles = positions.astype(jnp.float32)[..., None] * inv_freq.astype(jnp.float32)
    cos, sin = jnp.cos(angles)[..., None, :], jnp.sin(angles)[..., None, :]
    turn = lambda y, scale: rotate_half(rms_norm(y, scale, eps), cos, sin)  # noqa: E731
    q = None if wq is None else turn(heads(wq), q_norm)
    return q, turn(heads(wk), k_norm), heads(wv)
