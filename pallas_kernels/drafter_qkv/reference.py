"""float64 numpy golden of drafter_qkv, written from the math (no intermediate rounding)."""

from __future__ import annotations

import numpy as np


def _rms(x, scale, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def drafter_qkv_reference(x, positions, wq, wk, wv, q_norm, k_norm, inv_freq, *, norm, eps):
    """Arrays as in the operation (any float dtype) -> (q or None, k, v) float64."""
    f = lambda a: None if a is None else np.asarray(a, np.float64)  # noqa: E731
    x, wq, wk, wv, q_norm, k_norm, inv_freq, norm = map(f, (x, wq, wk, wv, q_norm, k_norm,
                                                            inv_freq, norm))
    hd = k_norm.shape[0]
    h = x if norm is None else _rms(x, norm, eps)
    # the angle is formed in float32, as the operation specifies (at position ~2000 its float32
    # rounding alone moves it by ~1e-4 rad); everything after it is float64
    ang = (np.asarray(positions, np.float32)[..., None, None]
           * inv_freq.astype(np.float32)).astype(np.float64)                   # [B, T, 1, hd/2]
    cos, sin = np.cos(ang), np.sin(ang)

    def turn(w, scale):
        y = _rms((h @ w).reshape(*h.shape[:-1], -1, hd), scale, eps)
        lo, hi = y[..., :hd // 2], y[..., hd // 2:]
        return np.concatenate([lo * cos - hi * sin, lo * sin + hi * cos], axis=-1)

    q = None if wq is None else turn(wq, q_norm)
    return q, turn(wk, k_norm), (h @ wv).reshape(*h.shape[:-1], -1, hd)
