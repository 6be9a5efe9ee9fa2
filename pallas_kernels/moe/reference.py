"""float64 numpy goldens, written from the math (independent of the JAX code)."""

from __future__ import annotations

import numpy as np


def dequantize_int4_golden(packed, scale) -> np.ndarray:
    """compressed-tensors (packed int32 [..., N, K/8], scale [..., N, K/32]) -> float64 [..., N, K].
    Weight k of row n = (nibble k%8 of word k//8, counted from the low end) - 8, times scale[k//32]."""
    words = np.asarray(packed).astype(np.int64) & 0xFFFFFFFF
    *lead, n, w = words.shape
    out = np.empty((*lead, n, w * 8), np.float64)
    for i in range(8):
        out[..., i::8] = ((words >> (4 * i)) & 0xF) - 8
    s = np.asarray(scale, np.float64)
    return out * np.repeat(s, 32, axis=-1)


def moe_experts_golden(x, topk_ids, topk_weights, gate, up, down) -> np.ndarray:
    """out[t] = sum_j w[t,j] * down[e] @ (silu(gate[e] @ x[t]) * (up[e] @ x[t])), e = ids[t,j].

    x [T, d]; gate, up [E, I, d] and down [E, d, I] in HF orientation; float64 [T, d].
    """
    x = np.asarray(x, np.float64)
    ids = np.asarray(topk_ids)
    w = np.asarray(topk_weights, np.float64)
    gate, up, down = (np.asarray(a, np.float64) for a in (gate, up, down))
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = ids[t, j]
            g = gate[e] @ x[t]
            h = g / (1.0 + np.exp(-g)) * (up[e] @ x[t])
            out[t] += w[t, j] * (down[e] @ h)
    return out
