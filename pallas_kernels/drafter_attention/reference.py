"""Float64 numpy golden for the drafter's block attention, written from the definition."""

from __future__ import annotations

import numpy as np


def drafter_attention_reference(q, ctx_k, ctx_v, ctx_lengths, k_blk, v_blk, *,
                                scale: float) -> np.ndarray:
    """q [B,b,H,hd], ctx_k/ctx_v [B,KV,N,hd], ctx_lengths [B] int, k_blk/v_blk [B,b,KV,hd]
    -> float64 [B,b,H,hd].

    Query head h reads KV head h // (H / KV). Every block slot sees its stream's context slots
    0..ctx_lengths[s]-1 and all b block slots; scores = scale * q.k, softmax over those keys.
    """
    q, ctx_k, ctx_v, k_blk, v_blk = (np.asarray(x).astype(np.float64)
                                     for x in (q, ctx_k, ctx_v, k_blk, v_blk))
    ctx_lengths = np.asarray(ctx_lengths)
    bsz, b, h, hd = q.shape
    kvh = ctx_k.shape[1]
    group = h // kvh
    out = np.zeros((bsz, b, h, hd))
    for s in range(bsz):
        for head in range(h):
            kv = head // group
            n = ctx_lengths[s]
            keys = np.concatenate([ctx_k[s, kv, :n], k_blk[s, :, kv]])               # [n+b, hd]
            vals = np.concatenate([ctx_v[s, kv, :n], v_blk[s, :, kv]])
            scores = q[s, :, head] @ keys.T * scale                                  # [b, n+b]
            p = np.exp(scores - scores.max(axis=1, keepdims=True))
            out[s, :, head] = (p / p.sum(axis=1, keepdims=True)) @ vals
    return out
