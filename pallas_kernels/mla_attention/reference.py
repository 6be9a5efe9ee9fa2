"""Float64 numpy golden for MLA tree-verify attention, written from the definition."""

from __future__ import annotations

import numpy as np


def visibility_from_mask_reference(node_mask: np.ndarray, num_q: int) -> np.ndarray:
    """node_mask [S, Q, ceil(Q/32)] int32 -> bool [S, Q, Q]: bit t%32 of word t//32 = sees token t."""
    words = np.asarray(node_mask).astype(np.int64) & 0xFFFFFFFF
    t = np.arange(num_q)
    return ((words[:, :, t // 32] >> (t % 32)) & 1).astype(bool)


def mla_attention_reference(q, kv, ctx_lens, node_mask, *, scale: float, v_dim: int) -> np.ndarray:
    """q [S,Q,H,Dk], kv [S,N,Dk], ctx_lens [S], node_mask [S,Q,W] -> float64 [S,Q,H,v_dim].

    Query i of stream s sees cache slots j < ctx_lens[s] and new token t (slot ctx_lens[s]+t)
    iff its bit is set; scores = scale * q.k; softmax over the visible keys; values kv[..., :v_dim];
    a query that sees nothing gives zeros.
    """
    q = np.asarray(q).astype(np.float64)
    kv = np.asarray(kv).astype(np.float64)
    ctx_lens = np.asarray(ctx_lens)
    num_s, num_q, num_h, _ = q.shape
    vis = visibility_from_mask_reference(node_mask, num_q)
    out = np.zeros((num_s, num_q, num_h, v_dim))
    for s in range(num_s):
        c = int(ctx_lens[s])
        keys = kv[s, : c + num_q]                                        # [c+Q, Dk]
        allowed = np.concatenate([np.ones((num_q, c), bool), vis[s]], axis=1)  # [Q, c+Q]
        scores = np.einsum("qhd,kd->qhk", q[s], keys, optimize=True) * scale
        scores = np.where(allowed[:, None, :], scores, -np.inf)
        seen = allowed.any(axis=1)                                      # [Q]
        m = np.where(seen[:, None], scores.max(axis=-1), 0.0)            # [Q, H]
        p = np.exp(scores - m[..., None])
        denom = np.where(seen[:, None], p.sum(axis=-1), 1.0)
        out[s] = np.einsum("qhk,kv->qhv", p, keys[:, :v_dim], optimize=True) / denom[..., None]
    return out
