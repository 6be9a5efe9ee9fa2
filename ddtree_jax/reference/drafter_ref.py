"""Float64 numpy golden of the DFlash drafter forward, written from the math (one sequence,
one head at a time)."""

from __future__ import annotations

import numpy as np


def _f64(tree):
    return {k: _f64(v) for k, v in tree.items()} if isinstance(tree, dict) else \
        np.asarray(tree).astype(np.float64)


def rms_norm_reference(x, scale, eps: float) -> np.ndarray:
    """scale * x / sqrt(mean(x^2) + eps) over the last axis."""
    return scale * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def rope_reference(x, positions, theta: float) -> np.ndarray:
    """Qwen3 RoPE: x [T, heads, hd], positions [T]; x*cos + rotate_half(x)*sin with the
    frequencies theta**(-2i/hd) repeated over both halves."""
    hd = x.shape[-1]
    freqs = np.outer(positions, 1.0 / theta ** (np.arange(0, hd, 2) / hd))   # [T, hd/2]
    emb = np.concatenate([freqs, freqs], axis=-1)[:, None, :]
    rotated = np.concatenate([-x[..., hd // 2:], x[..., : hd // 2]], axis=-1)
    return x * np.cos(emb) + rotated * np.sin(emb)


def _layer(p, cfg, x, ctx, pos_ctx, pos_blk):
    """One decoder layer for one sequence: x [b, d] block, ctx [n, d] fused context."""
    eps, hd = cfg.rms_norm_eps, cfg.head_dim
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    a = p["self_attn"]
    h = rms_norm_reference(x, p["input_layernorm"]["scale"], eps)
    q = (h @ a["q_proj"]["kernel"]).reshape(len(x), heads, hd)
    q = rope_reference(rms_norm_reference(q, a["q_norm"]["scale"], eps), pos_blk, cfg.rope_theta)
    src = np.concatenate([ctx, h])                                   # keys/values from ctx, block
    pos = np.concatenate([pos_ctx, pos_blk])
    k = (src @ a["k_proj"]["kernel"]).reshape(len(src), kv_heads, hd)
    k = rope_reference(rms_norm_reference(k, a["k_norm"]["scale"], eps), pos, cfg.rope_theta)
    v = (src @ a["v_proj"]["kernel"]).reshape(len(src), kv_heads, hd)
    out = np.zeros((len(x), heads, hd))
    for head in range(heads):
        g = head // (heads // kv_heads)
        s = q[:, head] @ k[:, g].T / np.sqrt(hd)                       # [b, n+b], no mask
        w = np.exp(s - s.max(axis=-1, keepdims=True))
        out[:, head] = (w / w.sum(axis=-1, keepdims=True)) @ v[:, g]
    x = x + out.reshape(len(x), heads * hd) @ a["o_proj"]["kernel"]
    m = p["mlp"]
    h = rms_norm_reference(x, p["post_attention_layernorm"]["scale"], eps)
    gate = h @ m["gate_proj"]["kernel"]
    return x + ((gate / (1.0 + np.exp(-gate))) * (h @ m["up_proj"]["kernel"])) @ m["down_proj"]["kernel"]


def drafter_hidden_reference(params, cfg, target_hidden, noise_embedding, positions) -> np.ndarray:
    """target_hidden [B,n,len(ids)*d], noise_embedding [B,b,d], positions [B,n+b] -> float64 [B,b,d].

    ctx = hidden_norm(target_hidden @ fc); each layer's keys/values come from [ctx ; normed block]
    (k_norm then RoPE at the positions), queries from the normed block (q_norm then RoPE at the
    block positions); attention is non-causal over all n+b keys; the result goes through `norm`.
    """
    p = _f64(params)
    taps = np.asarray(target_hidden).astype(np.float64)
    noise = np.asarray(noise_embedding).astype(np.float64)
    positions = np.asarray(positions).astype(np.float64)
    n = taps.shape[1]
    out = np.zeros_like(noise)
    for s in range(taps.shape[0]):
        ctx = rms_norm_reference(taps[s] @ p["fc"]["kernel"], p["hidden_norm"]["scale"], cfg.rms_norm_eps)
        x = noise[s]
        for i in range(cfg.num_hidden_layers):
            x = _layer(p[f"layers_{i}"], cfg, x, ctx, positions[s, :n], positions[s, n:])
        out[s] = rms_norm_reference(x, p["norm"]["scale"], cfg.rms_norm_eps)
    return out
