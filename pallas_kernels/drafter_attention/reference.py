"""Float64 numpy golden for the drafter's block attention, written from the definition."""

from __future__ import annotations

import numpy as np


def drafter_attention_reference(q, ctx_k, ctx_v, ctx_mask, k_blk, v_blk, *, scale: float) -> np.ndarray:
    """q [B,b,H,hd], ctx_k/ctx_v [B,KV,N,hd], ctx_mask [B,N] bool, k_blk/v_blk [B,b,KV,hd]
    -> float64 [B,b,H,hd].

    Query head h reads KV head h // (H / KV). Every block slot sees the visible context slots of
    its stream and all b block slots; scores = scale * q.k, softmax over those keys.
    """
    q, ctx_k, ctx_v, k_blk, v_blk = (np.asarray(x).astype(np.float64)
                                     for x in (q, ctx_k, ctx_v, k_blk, v_blk))
    ctx_mask = np.asarray(ctx_mask, bool)
    bsz, b, h, hd = q.shape
    kvh = ctx_k.shape[1]
    group = h // kvh
    out = np.zeros((bsz, b, h, hd))
    for s in range(bsz):
        for head in range(h):
            kv = head // group
            keys = np.concatenate([ctx_k[s, kv][ctx_mask[s]], k_blk[s, :, kv]])      # [n+b, hd]
            vals = np.concatenate([ctx_v[s, kv][ctx_mask[s]], v_blk[s, :, kv]])
            scores = q[s, :, head] @ keys.T * scale                                  # [b, n+b]
            p = np.exp(scores - scores.max(axis=1, keepdims=True))
            out[s, :, head] = (p / p.sum(axis=1, keepdims=True)) @ vals
    return out
