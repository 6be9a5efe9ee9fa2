"""Rotary position embeddings: plain and YaRN (DeepSeek-V3 / Kimi-K2), rotated in interleaved pairs."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from ddtree_jax.config import ModelConfig, RopeScaling, yarn_mscale


def _correction_dim(num_rotations: float, dim: int, base: float, max_pos: int) -> float:
    return (dim * math.log(max_pos / (num_rotations * 2 * math.pi))) / (2 * math.log(base))


def inv_freq(dim: int, theta: float, scaling: RopeScaling | None = None) -> np.ndarray:
    """Per-pair inverse frequencies [dim/2] (float64); YaRN blends interpolation and extrapolation."""
    freq_extra = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    if scaling is None:
        return freq_extra
    freq_inter = freq_extra / scaling.factor
    orig = scaling.original_max_position_embeddings
    low = max(math.floor(_correction_dim(scaling.beta_fast, dim, theta, orig)), 0)
    high = min(math.ceil(_correction_dim(scaling.beta_slow, dim, theta, orig)), dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    extra_mask = 1.0 - ramp
    return freq_inter * (1.0 - extra_mask) + freq_extra * extra_mask


def magnitude(scaling: RopeScaling | None) -> float:
    """YaRN's cos/sin multiplier mscale(factor, mscale) / mscale(factor, mscale_all_dim)."""
    if scaling is None:
        return 1.0
    return yarn_mscale(scaling.factor, scaling.mscale) / yarn_mscale(scaling.factor, scaling.mscale_all_dim)


def target_tables(cfg: ModelConfig, positions: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """cos, sin [..., rope/2] float32 for integer `positions` [...] of the target's MLA rope dims."""
    freqs = inv_freq(cfg.qk_rope_head_dim, cfg.rope_theta, cfg.rope_scaling)
    return tables(positions, freqs, magnitude(cfg.rope_scaling))


def tables(positions: jnp.ndarray, freqs: np.ndarray, scale: float = 1.0):
    """cos, sin [..., len(freqs)] float32 of positions * freqs (angles formed in float32)."""
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(freqs, jnp.float32)
    return jnp.cos(angles) * scale, jnp.sin(angles) * scale


def apply_interleaved(x: jnp.ndarray, cos: jnp.ndarray, sin: jnp.ndarray) -> jnp.ndarray:
    """Rotate pairs (x[2i], x[2i+1]) of x [..., r] by the angle whose cos/sin [..., r/2] are given."""
    xf = x.astype(jnp.float32).reshape(*x.shape[:-1], x.shape[-1] // 2, 2)
    x0, x1 = xf[..., 0], xf[..., 1]
    out = jnp.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)
    return out.reshape(x.shape).astype(x.dtype)
