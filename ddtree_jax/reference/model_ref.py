"""float64 numpy golden of the DeepSeek-V3 / Kimi-K2 target decoder, written from the math.

Conventions are those of docs/INTERFACES.md: dense kernels `[in, out]`, params as the nested
Flax pytree (`params["layers_0"]["self_attn"]["q_a_proj"]["kernel"]`, ...), rope dims rotated
in interleaved pairs, the MLA latent cache holding `rms_norm(c) ‖ rope(k_pe)` per token.
Routed experts come separately as HF-orientation arrays (`experts_hf`), because the params'
`mlp/experts` subtree is owned by the kernels. Nothing here calls JAX; `cfg` is only read.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np


def _f64(a) -> np.ndarray:
    return np.asarray(a, np.float64)


# ---- norms and activations ---------------------------------------------------------------

def rms_norm(x, scale, eps: float) -> np.ndarray:
    """x [..., n], scale [n] -> scale * x / sqrt(mean(x^2) + eps)."""
    x = _f64(x)
    return _f64(scale) * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def silu(x) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def sigmoid(x) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


# ---- YaRN RoPE -----------------------------------------------------------------------------

def _mscale(factor: float, m: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0


def _correction_dim(rotations: float, dim: int, base: float, max_pos: int) -> float:
    """Pair index whose wavelength makes `rotations` turns over `max_pos` positions."""
    return dim * math.log(max_pos / (rotations * 2 * math.pi)) / (2 * math.log(base))


def yarn_inv_freq(cfg) -> np.ndarray:
    """[rope/2] inverse frequencies (plain RoPE when cfg.rope_scaling is None)."""
    r, base = cfg.qk_rope_head_dim, cfg.rope_theta
    freq_extra = 1.0 / base ** (np.arange(0, r, 2, dtype=np.float64) / r)
    rs = cfg.rope_scaling
    if rs is None:
        return freq_extra
    freq_inter = freq_extra / rs.factor
    orig = rs.original_max_position_embeddings
    low = max(math.floor(_correction_dim(rs.beta_fast, r, base, orig)), 0)
    high = min(math.ceil(_correction_dim(rs.beta_slow, r, base, orig)), r - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(r // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    mask = 1.0 - ramp                       # 1: keep the original (extrapolated) frequency
    return freq_inter * (1.0 - mask) + freq_extra * mask


def rope_cos_sin(positions, cfg) -> tuple[np.ndarray, np.ndarray]:
    """positions [...] -> cos, sin [..., rope/2], times the YaRN mscale ratio."""
    angle = _f64(positions)[..., None] * yarn_inv_freq(cfg)
    rs = cfg.rope_scaling
    m = 1.0 if rs is None else _mscale(rs.factor, rs.mscale) / _mscale(rs.factor, rs.mscale_all_dim)
    return np.cos(angle) * m, np.sin(angle) * m


def apply_rope(x, positions, cfg) -> np.ndarray:
    """x [..., rope]; positions broadcastable to x.shape[:-1]. Rotates pairs (2i, 2i+1) in place."""
    x = _f64(x)
    cos, sin = rope_cos_sin(positions, cfg)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty(np.broadcast_shapes(x.shape, cos.shape[:-1] + (x.shape[-1],)))
    out[..., 0::2] = x0 * cos - x1 * sin
    out[..., 1::2] = x0 * sin + x1 * cos
    return out


# ---- MLP, router, MoE ----------------------------------------------------------------------

def swiglu_mlp(x, gate_kernel, up_kernel, down_kernel) -> np.ndarray:
    """x [..., d]; kernels [d, I], [d, I], [I, d] -> [..., d]."""
    x = _f64(x)
    return (silu(x @ _f64(gate_kernel)) * (x @ _f64(up_kernel))) @ _f64(down_kernel)


def router_choice(x, gate_kernel, bias, cfg) -> np.ndarray:
    """noaux_tc selection scores: x [T, d] -> sigmoid(x @ gate_kernel) + bias [T, E], experts
    outside the kept groups at -inf; a token's experts are its top num_experts_per_tok."""
    b = sigmoid(_f64(x) @ _f64(gate_kernel)) + _f64(bias)
    E = cfg.n_routed_experts
    per_group = E // cfg.n_group
    if cfg.n_group > 1:
        for t in range(b.shape[0]):
            group_score = [sum(sorted(b[t, g * per_group:(g + 1) * per_group])[-2:])
                           for g in range(cfg.n_group)]
            kept = np.argsort(-np.asarray(group_score), kind="stable")[:cfg.topk_group]
            b[t] = np.where(np.isin(np.arange(E) // per_group, kept), b[t], -np.inf)
    return b


def router(x, gate_kernel, bias, cfg) -> tuple[np.ndarray, np.ndarray]:
    """noaux_tc: x [T, d], gate_kernel [d, E], bias [E] -> (ids [T, k] int64, weights [T, k]).

    ids are ordered by descending biased score, ties to the lower expert id.
    """
    s_all = sigmoid(_f64(x) @ _f64(gate_kernel))
    choice = router_choice(x, gate_kernel, bias, cfg)
    k = cfg.num_experts_per_tok
    ids = np.argsort(-choice, axis=1, kind="stable")[:, :k]
    w = np.take_along_axis(s_all, ids, axis=1)
    if cfg.norm_topk_prob:
        w = w / (w.sum(axis=1, keepdims=True) + 1e-20)
    return ids.astype(np.int64), w * cfg.routed_scaling_factor


def moe_layer(x, mlp_params, cfg, experts_hf) -> np.ndarray:
    """x [T, d] -> [T, d]: routed experts (experts_hf: gate/up [E, I, d], down [E, d, I], HF
    [out, in] orientation, dequantised for INT4) weighted by the router, plus shared experts."""
    x = _f64(x)
    ids, weights = router(x, mlp_params["gate"]["kernel"],
                          mlp_params["gate"]["e_score_correction_bias"], cfg)
    gate, up, down = (_f64(experts_hf[n]) for n in ("gate", "up", "down"))
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for e, w in zip(ids[t], weights[t]):
            out[t] += w * (down[e] @ (silu(gate[e] @ x[t]) * (up[e] @ x[t])))
    if cfg.n_shared_experts > 0:
        sh = mlp_params["shared_experts"]
        out += swiglu_mlp(x, sh["gate_proj"]["kernel"], sh["up_proj"]["kernel"],
                          sh["down_proj"]["kernel"])
    return out


# ---- MLA attention -------------------------------------------------------------------------

def mla_attention(x, attn_params, positions, cache_latent, cache_len, visibility, cfg):
    """Naive MLA over a latent cache.

    x [S, T, d], positions [S, T], cache_latent [S, N, latent] or None (empty), cache_len [S],
    visibility [S, T, T] bool or None (causal). Token i of stream s sees cache slots
    j < cache_len[s] and new token t where visibility[s, i, t]; a row seeing nothing gives 0.
    Returns (out [S, T, d], new_latent [S, T, kv_lora + rope] = rms_norm(c) ‖ rope(k_pe)).
    """
    p = attn_params
    x = _f64(x)
    S, T, _ = x.shape
    H, nope, r, vd, kvl = (cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim,
                           cfg.v_head_dim, cfg.kv_lora_rank)
    eps = cfg.rms_norm_eps
    positions = np.asarray(positions)
    if "q_a_proj" in p:
        q = rms_norm(x @ _f64(p["q_a_proj"]["kernel"]), p["q_a_layernorm"]["scale"], eps)
        q = q @ _f64(p["q_b_proj"]["kernel"])
    else:
        q = x @ _f64(p["q_proj"]["kernel"])
    q = q.reshape(S, T, H, nope + r)
    q_nope, q_pe = q[..., :nope], apply_rope(q[..., nope:], positions[:, :, None], cfg)
    kv_a = x @ _f64(p["kv_a_proj_with_mqa"]["kernel"])
    c = rms_norm(kv_a[..., :kvl], p["kv_a_layernorm"]["scale"], eps)
    new_latent = np.concatenate([c, apply_rope(kv_a[..., kvl:], positions, cfg)], axis=-1)

    w_kv_b = _f64(p["kv_b_proj"]["kernel"])
    if visibility is None:
        visibility = np.broadcast_to(np.tril(np.ones((T, T), bool)), (S, T, T))
    cache_len = np.zeros(S, np.int64) if cache_latent is None else np.asarray(cache_len)
    out = np.zeros((S, T, H, vd))
    for s in range(S):
        n = int(cache_len[s])
        old = np.zeros((0, kvl + r)) if cache_latent is None else _f64(cache_latent[s, :n])
        lat = np.concatenate([old, new_latent[s]], axis=0)                   # [n+T, latent]
        kv = (lat[:, :kvl] @ w_kv_b).reshape(n + T, H, nope + vd)
        k_nope, v = kv[..., :nope], kv[..., nope:]
        scores = (np.einsum("thd,jhd->htj", q_nope[s], k_nope)
                  + np.einsum("thd,jd->htj", q_pe[s], lat[:, kvl:])) * cfg.softmax_scale
        seen = np.concatenate([np.ones((T, n), bool), np.asarray(visibility[s], bool)], axis=1)
        scores = np.where(seen, scores, -np.inf)
        mx = np.max(scores, axis=-1, keepdims=True)
        prob = np.where(seen, np.exp(scores - np.where(np.isfinite(mx), mx, 0.0)), 0.0)
        den = prob.sum(axis=-1, keepdims=True)
        prob = np.divide(prob, den, out=np.zeros_like(prob), where=den > 0)
        out[s] = np.einsum("htj,jhd->thd", prob, v)
    return out.reshape(S, T, H * vd) @ _f64(p["o_proj"]["kernel"]), new_latent


# ---- decoder -------------------------------------------------------------------------------

def decoder_forward(params, cfg, tokens, positions=None, cache=None, visibility=None, taps=(),
                    experts_hf=None, choices: dict | None = None):
    """Whole target forward.

    tokens [S, T]; positions [S, T] (None: lengths[s] + arange(T)); cache None or
    (latents: list per layer of [S, N, latent], lengths [S]); visibility [S, T, T] bool or
    None (causal); taps: 0-based layer ids; experts_hf: {layer: dict(gate, up, down)} for MoE
    layers. Returns (logits [S, T, V], new_latents [L] of [S, T, latent],
    taps [S, T, len(taps) * d], the output of each tapped layer in the order given, the last
    layer's after the final norm, as transformers' hidden_states[i + 1]).
    choices: a dict that receives {layer: router_choice [S, T, E]} for every MoE layer.
    """
    tokens = np.asarray(tokens)
    S, T = tokens.shape
    L = cfg.num_hidden_layers
    if tokens.min() < 0 or tokens.max() >= cfg.vocab_size:
        raise ValueError(f"tokens out of vocabulary range [0, {cfg.vocab_size})")
    latents, lengths = ([None] * L, np.zeros(S, np.int64)) if cache is None else cache
    lengths = np.asarray(lengths)
    if positions is None:
        positions = lengths[:, None] + np.arange(T)
    eps = cfg.rms_norm_eps
    h = _f64(params["embed_tokens"]["embedding"])[tokens]
    new_latents, tapped = [], {}
    for i in range(L):
        lp = params[f"layers_{i}"]
        a, lat = mla_attention(rms_norm(h, lp["input_layernorm"]["scale"], eps), lp["self_attn"],
                               positions, latents[i], lengths, visibility, cfg)
        new_latents.append(lat)
        h = h + a
        hn = rms_norm(h, lp["post_attention_layernorm"]["scale"], eps)
        mlp = lp["mlp"]
        if cfg.is_moe_layer(i):
            if experts_hf is None or i not in experts_hf:
                raise ValueError(f"decoder_forward: experts_hf has no entry for MoE layer {i}")
            m = moe_layer(hn.reshape(S * T, -1), mlp, cfg, experts_hf[i]).reshape(h.shape)
            if choices is not None:
                choices[i] = router_choice(hn.reshape(S * T, -1), mlp["gate"]["kernel"],
                                           mlp["gate"]["e_score_correction_bias"], cfg).reshape(S, T, -1)
        else:
            m = swiglu_mlp(hn, mlp["gate_proj"]["kernel"], mlp["up_proj"]["kernel"],
                           mlp["down_proj"]["kernel"])
        h = h + m
        tapped[i] = h
    tapped[L - 1] = h = rms_norm(h, params["norm"]["scale"], eps)
    logits = h @ _f64(params["lm_head"]["kernel"])
    tap_out = (np.concatenate([tapped[i] for i in taps], axis=-1) if taps
               else np.zeros((S, T, 0)))
    return logits, new_latents, tap_out


def extend_cache(cache, new_latents):
    """Write new_latents [L] of [S, T, latent] at slots lengths[s] + t of cache (None = empty).

    Returns (latents [L] of [S, N', latent], lengths + T).
    """
    S, T, D = new_latents[0].shape
    if cache is None:
        cache = ([np.zeros((S, 0, D))] * len(new_latents), np.zeros(S, np.int64))
    latents, lengths = cache
    lengths = np.asarray(lengths)
    size = max(latents[0].shape[1], int(lengths.max()) + T)
    out = []
    for old, new in zip(latents, new_latents):
        buf = np.zeros((S, size, D))
        buf[:, :old.shape[1]] = _f64(old)
        for s in range(S):
            buf[s, lengths[s]:lengths[s] + T] = _f64(new[s])
        out.append(buf)
    return out, lengths + T


# ---- random params for tests ---------------------------------------------------------------

def random_params(cfg, rng: np.random.Generator, experts_hf: bool = True):
    """Small random target params in the pytree of docs/INTERFACES.md.

    All values are bf16-representable, stored as float32 numpy (the correction bias is any
    float32). `params["layers_i"]["mlp"]["experts"]` is an empty placeholder for MoE layers;
    the routed experts are returned as {layer: dict(gate [E, I, d], up [E, I, d],
    down [E, d, I])} (None when experts_hf is False).
    """
    def bf16(a):
        return np.asarray(a).astype(ml_dtypes.bfloat16).astype(np.float32)

    def dense(n_in, n_out):
        return {"kernel": bf16(rng.standard_normal((n_in, n_out)) / math.sqrt(n_in))}

    def norm(n):
        return {"scale": bf16(1.0 + 0.1 * rng.standard_normal(n))}

    def swiglu(d, inter):
        return {"gate_proj": dense(d, inter), "up_proj": dense(d, inter),
                "down_proj": dense(inter, d)}

    d, H, V = cfg.hidden_size, cfg.num_attention_heads, cfg.vocab_size
    E, I = cfg.n_routed_experts, cfg.moe_intermediate_size
    params = {"embed_tokens": {"embedding": bf16(rng.standard_normal((V, d)))}}
    experts = {} if experts_hf else None
    for i in range(cfg.num_hidden_layers):
        attn = {}
        if cfg.q_lora_rank is None:
            attn["q_proj"] = dense(d, H * cfg.qk_head_dim)
        else:
            attn["q_a_proj"] = dense(d, cfg.q_lora_rank)
            attn["q_a_layernorm"] = norm(cfg.q_lora_rank)
            attn["q_b_proj"] = dense(cfg.q_lora_rank, H * cfg.qk_head_dim)
        attn["kv_a_proj_with_mqa"] = dense(d, cfg.latent_dim)
        attn["kv_a_layernorm"] = norm(cfg.kv_lora_rank)
        attn["kv_b_proj"] = dense(cfg.kv_lora_rank, H * (cfg.qk_nope_head_dim + cfg.v_head_dim))
        attn["o_proj"] = dense(H * cfg.v_head_dim, d)
        if cfg.is_moe_layer(i):
            mlp = {"gate": {"kernel": bf16(rng.standard_normal((d, E)) / math.sqrt(d)),
                            "e_score_correction_bias": (0.1 * rng.standard_normal(E)).astype(np.float32)},
                   "experts": {}}
            if cfg.n_shared_experts > 0:
                mlp["shared_experts"] = swiglu(d, cfg.n_shared_experts * I)
            if experts_hf:
                experts[i] = {"gate": bf16(rng.standard_normal((E, I, d)) / math.sqrt(d)),
                              "up": bf16(rng.standard_normal((E, I, d)) / math.sqrt(d)),
                              "down": bf16(rng.standard_normal((E, d, I)) / math.sqrt(I))}
        else:
            mlp = swiglu(d, cfg.intermediate_size)
        params[f"layers_{i}"] = {"input_layernorm": norm(d), "self_attn": attn,
                                 "post_attention_layernorm": norm(d), "mlp": mlp}
    params["norm"] = norm(d)
    params["lm_head"] = dense(d, V)
    return params, experts
