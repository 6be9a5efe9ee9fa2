"""float64 numpy goldens, written from the math (independent of the JAX code): the INT4 format and
the routed-expert MoE.

INT4 (compressed-tensors pack-quantized, symmetric, group 32 along K): `packed` int32 [..., N, K/8],
word w holds K indices 8w..8w+7, index 8w+j in bits 4j..4j+3 (lowest K index in the lowest
nibble); nibble = value + 8, value in [-8, 7]; `scale` [..., N, K/group]; weight = value * scale
of its group.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np


def pack_int4_reference(values) -> np.ndarray:
    """int values [..., N, K] in [-8, 7] -> int32 [..., N, K/8]."""
    v = np.asarray(values)
    if v.shape[-1] % 8:
        raise ValueError(f"pack_int4: K={v.shape[-1]} is not a multiple of 8")
    if v.size and (v.min() < -8 or v.max() > 7):
        raise ValueError(f"pack_int4: values must lie in [-8, 7], got [{v.min()}, {v.max()}]")
    nib = (v.astype(np.int64) + 8).astype(np.uint32).reshape(*v.shape[:-1], v.shape[-1] // 8, 8)
    shifts = (4 * np.arange(8)).astype(np.uint32)
    words = np.bitwise_or.reduce(nib << shifts, axis=-1)
    return words.astype(np.uint32).view(np.int32)


def unpack_int4_reference(packed) -> np.ndarray:
    """int32 [..., N, K/8] -> int64 values [..., N, K] in [-8, 7] (inverse of pack_int4_reference)."""
    w = np.ascontiguousarray(np.asarray(packed, np.int32)).view(np.uint32)
    shifts = (4 * np.arange(8)).astype(np.uint32)
    nib = (w[..., None] >> shifts) & np.uint32(0xF)
    return nib.astype(np.int64).reshape(*w.shape[:-1], w.shape[-1] * 8) - 8


def quantize_int4_reference(w, group: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """float w [..., N, K] -> (packed int32 [..., N, K/8], scale float32 [..., N, K/group]).

    scale = bf16(max|w_group| / 7); q = clip(round(w / scale), -8, 7) (q = 0 where scale = 0).
    """
    w = np.asarray(w, np.float64)
    if w.shape[-1] % group:
        raise ValueError(f"quantize_int4: K={w.shape[-1]} is not a multiple of group {group}")
    g = w.reshape(*w.shape[:-1], w.shape[-1] // group, group)
    scale = (np.abs(g).max(axis=-1) / 7.0).astype(ml_dtypes.bfloat16).astype(np.float32)
    s = scale.astype(np.float64)[..., None]
    q = np.round(np.divide(g, s, out=np.zeros_like(g), where=s > 0))
    q = np.clip(q, -8, 7).astype(np.int64).reshape(w.shape)
    return pack_int4_reference(q), scale


def dequantize_int4_reference(packed, scale, group: int = 32) -> np.ndarray:
    """(packed int32 [..., N, K/8], scale [..., N, K/group]) -> float64 [..., N, K]."""
    q = unpack_int4_reference(packed).astype(np.float64)
    s = np.asarray(scale).astype(np.float64)
    if q.shape[-1] != s.shape[-1] * group:
        raise ValueError(f"dequantize_int4: K={q.shape[-1]} does not match scale groups "
                         f"{s.shape[-1]} x {group}")
    return (q.reshape(*q.shape[:-1], s.shape[-1], group) * s[..., None]).reshape(q.shape)


def moe_experts_reference(x, topk_ids, topk_weights, gate, up, down, valid=None) -> np.ndarray:
    """out[t] = sum over valid j of w[t,j] * down[e] @ (silu(gate[e] @ x[t]) * (up[e] @ x[t])),
    e = ids[t,j].

    x [T, d]; gate, up [E, I, d] and down [E, d, I] in HF orientation; valid [T, k] bool (None:
    every slot); float64 [T, d] (0 for a token without a valid slot).
    """
    x = np.asarray(x, np.float64)
    ids = np.asarray(topk_ids)
    w = np.asarray(topk_weights, np.float64)
    valid = np.ones(ids.shape, bool) if valid is None else np.asarray(valid, bool)
    gate, up, down = (np.asarray(a, np.float64) for a in (gate, up, down))
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            if not valid[t, j]:
                continue
            e = ids[t, j]
            g = gate[e] @ x[t]
            h = g / (1.0 + np.exp(-g)) * (up[e] @ x[t])
            out[t] += w[t, j] * (down[e] @ h)
    return out
