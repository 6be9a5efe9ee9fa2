"""Kimi-K2 / DeepSeek-V3 target decoder in Flax Linen, used functionally.

One forward serves prefill, chain verify and tree verify: it takes S streams of T new tokens with
their positions and the visibility of the new tokens among themselves, attends against an explicit
per-stream MLA latent cache, and returns float32 logits, the updated cache and the hidden states
after the requested layers (the drafter's taps). Params are the plain pytree of docs/INTERFACES.md;
the routed experts and the attention over the cache go through the `pallas_kernels` operations
(`Kernels` picks each one's implementation).
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax import rope
from ddtree_jax import sharding
from ddtree_jax.checks import integer_array
from ddtree_jax.config import Kernels, ModelConfig
from pallas_kernels import moe as moe_kernels
from pallas_kernels import mla_attention as mla_kernels

_INIT_STD = 0.02


class RMSNorm(nn.Module):
    """y = scale * x / sqrt(mean(x^2) + eps), in float32, cast back to x.dtype."""

    eps: float
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), self.param_dtype)
        xf = x.astype(jnp.float32)
        y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        return (y * scale.astype(jnp.float32)).astype(x.dtype)


class Linear(nn.Module):
    """x @ kernel with kernel [in_features, out_features]; `weight()` returns the kernel itself."""

    in_features: int
    out_features: int
    param_dtype: Any = jnp.float32

    def setup(self):
        self.kernel = self.param("kernel", nn.initializers.normal(_INIT_STD),
                                 (self.in_features, self.out_features), self.param_dtype)

    def weight(self):
        return self.kernel

    def __call__(self, x):
        return x @ self.kernel.astype(x.dtype)


class Embed(nn.Module):
    """Token embedding `embedding` [V, d]: tokens [...] -> [..., d] (vocabulary-parallel under a mesh)."""

    vocab: int
    features: int
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, tokens):
        table = self.param("embedding", nn.initializers.normal(_INIT_STD), (self.vocab, self.features),
                           self.param_dtype)
        return sharding.vocab_embed(table, tokens)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)): the dense MLP and the shared experts."""

    d: int
    inner: int
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        g = Linear(self.d, self.inner, self.param_dtype, name="gate_proj")(x)
        u = Linear(self.d, self.inner, self.param_dtype, name="up_proj")(x)
        return Linear(self.inner, self.d, self.param_dtype, name="down_proj")(jax.nn.silu(g) * u)


@flax.struct.dataclass
class LatentCache:
    """MLA latent cache: kv[l] [S, max_len, kv_lora_rank + rope] per layer, lengths [S] int32."""

    kv: tuple
    lengths: jnp.ndarray

    @property
    def max_len(self) -> int:
        return self.kv[0].shape[1]


# Cache slots per stream are allocated in multiples of this: the Mosaic GPU attention kernel reads
# the cache with TMA in (8, 64) tiles, and any other slot count costs it a padded copy of the whole
# cache on every call (docs/kernels/mla_attention.md, "Design: the Mosaic GPU kernel").
CACHE_SLOT_ALIGN = 8


def aligned_slots(slots: int) -> int:
    """`slots` rounded up to a multiple of CACHE_SLOT_ALIGN."""
    return -(-slots // CACHE_SLOT_ALIGN) * CACHE_SLOT_ALIGN


def init_cache(cfg: ModelConfig, streams: int, max_len: int, dtype=jnp.float32) -> LatentCache:
    """An empty cache of `max_len` slots per stream."""
    kv = tuple(jnp.zeros((streams, max_len, cfg.latent_dim), dtype) for _ in range(cfg.num_hidden_layers))
    return LatentCache(kv=kv, lengths=jnp.zeros((streams,), jnp.int32))


@flax.struct.dataclass
class ForwardOut:
    logits: jnp.ndarray   # [S, T, V] float32
    cache: LatentCache
    taps: jnp.ndarray     # [S, T, len(taps) * d]


def router_logits(x, kernel):
    """x [T, d], router kernel [d, E] -> float32 logits [T, E] at full float32 precision: a TF32 or
    bf16-pass product moves scores by ~1e-3, enough to flip a near-tied expert choice."""
    return jnp.dot(x.astype(jnp.float32), kernel.astype(jnp.float32),
                   precision=jax.lax.Precision.HIGHEST)


def route_choice(logits, bias, cfg: ModelConfig):
    """noaux_tc selection scores: logits [T, E] float32 -> (scores = sigmoid(logits), choice =
    scores + bias with experts outside the kept groups at -inf), both [T, E]. The top
    num_experts_per_tok of `choice` are the token's experts."""
    scores = jax.nn.sigmoid(logits)
    choice = scores + bias.astype(jnp.float32)
    if cfg.n_group > 1:
        grouped = choice.reshape(choice.shape[0], cfg.n_group, -1)
        group_score = jax.lax.top_k(grouped, 2)[0].sum(-1)                      # [T, G]
        _, keep = jax.lax.top_k(group_score, cfg.topk_group)                   # [T, topk_group]
        group_mask = jnp.zeros_like(group_score, bool).at[
            jnp.arange(choice.shape[0])[:, None], keep].set(True)
        choice = jnp.where(jnp.repeat(group_mask, choice.shape[1] // cfg.n_group, axis=1),
                           choice, -jnp.inf)
    return scores, choice


def route(logits, bias, cfg: ModelConfig):
    """noaux_tc router: logits [T, E] float32 -> (ids [T, k] int32, weights [T, k] float32)."""
    scores, choice = route_choice(logits, bias, cfg)
    _, ids = jax.lax.top_k(choice, cfg.num_experts_per_tok)
    weights = jnp.take_along_axis(scores, ids, axis=1)
    if cfg.norm_topk_prob:
        weights = weights / (weights.sum(-1, keepdims=True) + 1e-20)
    return ids.astype(jnp.int32), weights * cfg.routed_scaling_factor


class Router(nn.Module):
    """The router's params: kernel [d, E] and the float32 selection bias e_score_correction_bias [E]."""

    d: int
    experts: int
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self):
        kernel = self.param("kernel", nn.initializers.normal(_INIT_STD), (self.d, self.experts),
                            self.param_dtype)
        bias = self.param("e_score_correction_bias", nn.initializers.zeros, (self.experts,), jnp.float32)
        return kernel, bias


class MoE(nn.Module):
    """noaux_tc-routed experts (through the "moe_experts" kernel op) plus shared experts.

    x [S, T, d], valid [S, T] bool: the routed experts compute only valid tokens' slots (an
    invalid token's routed output is 0, and its slots take no rows of the expert GEMMs)."""

    cfg: ModelConfig
    param_dtype: Any = jnp.float32
    kernels: Kernels = Kernels()

    @nn.compact
    def __call__(self, x, valid):
        cfg = self.cfg
        d, e = cfg.hidden_size, cfg.n_routed_experts
        gate, bias = Router(d, e, self.param_dtype, name="gate")()
        experts = self.param("experts", functools.partial(init_experts, cfg, dtype=self.param_dtype))
        xt = x.reshape(-1, d)
        with jax.named_scope("router"):
            ids, weights = route(router_logits(xt, gate), bias, cfg)
        slots = jnp.broadcast_to(valid.reshape(-1, 1), ids.shape)
        with jax.named_scope("routed_experts"):
            routed = sharding.moe_experts(functools.partial(moe_kernels.moe_experts, impl=self.kernels.moe),
                                          xt, ids, weights, experts, slots)
        out = routed.reshape(x.shape).astype(x.dtype)
        if cfg.n_shared_experts:
            out = out + SwiGLU(d, cfg.n_shared_experts * cfg.moe_intermediate_size, self.param_dtype,
                               name="shared_experts")(x)
        return out


def init_experts(cfg: ModelConfig, key, dtype=jnp.float32):
    """Random routed experts in the kernel layout (bf16/float weights or INT4 pack-quantized)."""
    e, d, i = cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size
    kg, ku, kd = jax.random.split(key, 3)
    if cfg.quant.format == "bf16":
        w = lambda k, shape: (jax.random.normal(k, shape, jnp.float32) * _INIT_STD).astype(dtype)
        return moe_kernels.prepare_experts_bf16(w(kg, (e, i, d)), w(ku, (e, i, d)), w(kd, (e, d, i)))
    g = cfg.quant.group_size

    def q(k, n, kk):  # uniform nibbles (std ~4.6) scaled so the weights have std ~_INIT_STD
        kb, ks = jax.random.split(k)
        packed = jax.lax.bitcast_convert_type(jax.random.bits(kb, (e, n, kk // 8), jnp.uint32), jnp.int32)
        scale = (_INIT_STD / 4.6) * jax.random.uniform(ks, (e, n, kk // g), jnp.float32, 0.5, 1.5)
        return packed, scale.astype(jnp.bfloat16)

    return moe_kernels.prepare_experts_int4(*q(kg, i, d), *q(ku, i, d), *q(kd, d, i),
                                            scale_dtype=jnp.dtype(cfg.quant.scale_dtype))


def _scatter_new(kv, lengths, new):
    """Write new [S, T, D] at slots lengths[s] + t of kv [S, N, D]; slots past N are dropped.

    Padding tokens (t >= num_new) are written too, so every slot a kernel may load is finite; they
    lie beyond the new length and are overwritten later.
    """
    s, t = new.shape[:2]
    slots = lengths[:, None] + jnp.arange(t)[None, :]
    return kv.at[jnp.arange(s)[:, None], slots].set(new.astype(kv.dtype), mode="drop")


def effective_visibility(visibility, num_new):
    """[S, T, T] bool: the caller's visibility among valid new tokens, plus every token sees itself."""
    t = visibility.shape[-1]
    valid = jnp.arange(t)[None, None, :] < num_new[:, None, None]
    return (visibility & valid) | jnp.eye(t, dtype=bool)[None]


class MLA(nn.Module):
    """Multi-head latent attention against the latent cache (absorbed or naive form)."""

    cfg: ModelConfig
    param_dtype: Any = jnp.float32
    kernels: Kernels = Kernels()

    @nn.compact
    def __call__(self, x, positions, kv, lengths, visibility, num_new, mode: str):
        cfg, pd = self.cfg, self.param_dtype
        s, t, d = x.shape
        h, nope, rdim, vdim, lora = (cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim,
                                     cfg.v_head_dim, cfg.kv_lora_rank)
        if cfg.q_lora_rank:
            q = Linear(d, cfg.q_lora_rank, pd, name="q_a_proj")(x)
            q = RMSNorm(cfg.rms_norm_eps, pd, name="q_a_layernorm")(q)
            q = Linear(cfg.q_lora_rank, h * cfg.qk_head_dim, pd, name="q_b_proj")(q)
        else:
            q = Linear(d, h * cfg.qk_head_dim, pd, name="q_proj")(x)
        q = q.reshape(s, t, h, cfg.qk_head_dim)
        q_nope, q_pe = q[..., :nope], q[..., nope:]
        kv_a = Linear(d, lora + rdim, pd, name="kv_a_proj_with_mqa")(x)
        c = RMSNorm(cfg.rms_norm_eps, pd, name="kv_a_layernorm")(kv_a[..., :lora])
        cos, sin = rope.target_tables(cfg, positions)                             # [S, T, r/2]
        q_pe = rope.apply_interleaved(q_pe, cos[:, :, None], sin[:, :, None])
        k_pe = rope.apply_interleaved(kv_a[..., lora:], cos, sin)
        kv = sharding.constrain(_scatter_new(kv, lengths, jnp.concatenate([c, k_pe], axis=-1)),
                                sharding.LATENT_CACHE)

        w_kv_b = Linear(lora, h * (nope + vdim), pd, name="kv_b_proj").weight().reshape(lora, h, nope + vdim)
        w_uk, w_uv = w_kv_b[..., :nope].astype(x.dtype), w_kv_b[..., nope:].astype(x.dtype)
        vis = effective_visibility(visibility, num_new)
        if mode == "absorbed":  # heads first: the per-head matmuls' own layout, no [t, h] transposes
            # The latent and rope parts go in apart: concatenated, the [S, H, T, Dk] query costs XLA
            # a slow transpose fusion.
            q_lat = jnp.einsum("sthn,lhn->shtl", q_nope, w_uk)
            attend = functools.partial(mla_kernels.mla_attention, impl=self.kernels.attn,
                                       scale=cfg.softmax_scale, v_dim=lora, heads_first=True,
                                       balance=self.kernels.attn_balance)
            with jax.named_scope("attention_core"):
                o_lat = sharding.attention(attend, q_lat, kv, lengths, mla_kernels.visibility_to_mask(vis),
                                           heads_first=True, q_rope=q_pe.swapaxes(1, 2))
            o = jnp.einsum("shtl,lhv->sthv", o_lat.astype(x.dtype), w_uv)
        elif mode == "naive":
            with jax.named_scope("attention_core"):
                o = _naive_attention(q_nope, q_pe, kv.astype(x.dtype), lengths, vis, w_uk, w_uv, cfg)
        else:
            raise ValueError(f"attn_mode must be 'absorbed' or 'naive', got {mode!r}")
        out = Linear(h * vdim, d, pd, name="o_proj")(o.reshape(s, t, h * vdim).astype(x.dtype))
        return out, kv


def _naive_attention(q_nope, q_pe, kv, lengths, vis, w_uk, w_uv, cfg: ModelConfig):
    """Decompress every cached key/value per head and attend: [S, T, H, v_head]."""
    lora = cfg.kv_lora_rank
    c, k_pe = kv[..., :lora], kv[..., lora:]                                       # [S, N, .]
    k_nope = jnp.einsum("snl,lhk->snhk", c, w_uk)
    v = jnp.einsum("snl,lhv->snhv", c, w_uv)
    scores = (jnp.einsum("sthk,snhk->shtn", q_nope, k_nope, preferred_element_type=jnp.float32)
              + jnp.einsum("sthr,snr->shtn", q_pe, k_pe, preferred_element_type=jnp.float32))
    mask = attention_mask(lengths, vis, kv.shape[1])                               # [S, T, N]
    scores = jnp.where(mask[:, None], scores * cfg.softmax_scale, -jnp.inf)
    p = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("shtn,snhv->sthv", p.astype(v.dtype), v)


def attention_mask(lengths, vis, n: int):
    """[S, T, N] bool: slot j is visible to new token i if j < lengths or it holds a visible new token."""
    j = jnp.arange(n)[None, None, :]
    rel = j - lengths[:, None, None]                                               # index among new tokens
    t = vis.shape[-1]
    new_vis = jnp.take_along_axis(vis, jnp.clip(rel, 0, t - 1).repeat(t, axis=1), axis=2)
    return (rel < 0) | ((rel < t) & new_vis)


class DecoderLayer(nn.Module):
    cfg: ModelConfig
    index: int
    param_dtype: Any = jnp.float32
    kernels: Kernels = Kernels()

    @nn.compact
    def __call__(self, x, positions, kv, lengths, visibility, num_new, mode):
        cfg, pd = self.cfg, self.param_dtype
        a, kv = MLA(cfg, pd, self.kernels, name="self_attn")(
            RMSNorm(cfg.rms_norm_eps, pd, name="input_layernorm")(x),
            positions, kv, lengths, visibility, num_new, mode)
        h = x + a
        y = RMSNorm(cfg.rms_norm_eps, pd, name="post_attention_layernorm")(h)
        if cfg.is_moe_layer(self.index):
            valid = jnp.arange(x.shape[1])[None, :] < num_new[:, None]       # [S, T]
            m = MoE(cfg, pd, self.kernels, name="mlp")(y, valid)
        else:
            m = SwiGLU(cfg.hidden_size, cfg.intermediate_size, pd, name="mlp")(y)
        return h + m, kv


class Decoder(nn.Module):
    cfg: ModelConfig
    param_dtype: Any = jnp.float32
    kernels: Kernels = Kernels()

    @nn.compact
    def __call__(self, tokens, positions, kv, lengths, visibility, num_new, taps: Sequence[int],
                 mode: str = "absorbed"):
        cfg, pd = self.cfg, self.param_dtype
        x = Embed(cfg.vocab_size, cfg.hidden_size, pd, name="embed_tokens")(tokens)
        new_kv, tapped = [], {}
        for i in range(cfg.num_hidden_layers):
            x, layer_kv = DecoderLayer(cfg, i, pd, self.kernels, name=f"layers_{i}")(
                x, positions, kv[i], lengths, visibility, num_new, mode)
            new_kv.append(layer_kv)
            if i in taps:
                tapped[i] = x
        x = RMSNorm(cfg.rms_norm_eps, pd, name="norm")(x)
        if cfg.num_hidden_layers - 1 in taps:      # HF hidden_states[L] is the final-normed state
            tapped[cfg.num_hidden_layers - 1] = x
        head = Linear(cfg.hidden_size, cfg.vocab_size, pd, name="lm_head").weight()
        with jax.named_scope("lm_head"):
            logits = sharding.constrain(
                jnp.einsum("std,dv->stv", x, head.astype(x.dtype), preferred_element_type=jnp.float32),
                ("streams", None, "vocab"))
        tap_out = (jnp.concatenate([tapped[i] for i in taps], axis=-1) if taps
                   else jnp.zeros(x.shape[:2] + (0,), x.dtype))
        return logits, tuple(new_kv), tap_out


def init_target(cfg: ModelConfig, key, dtype=jnp.float32, *, mesh: jax.sharding.Mesh | None = None):
    """Random target params (the same pytree as `load_target` returns). With `mesh`, every leaf
    is created directly in its shards (`sharding.param_shardings`); the values do not depend on it."""
    if mesh is None:
        return _init_target_jit(cfg, key, dtype)
    shapes = jax.eval_shape(functools.partial(_init_target, cfg, dtype=dtype), key)
    out = sharding.param_shardings(shapes, mesh)
    return jax.jit(_init_target, static_argnums=(0, 2), out_shardings=out)(cfg, key, dtype)


def _init_target(cfg: ModelConfig, key, dtype):
    # The counter-based "rbg" generator compiles far faster than threefry for hundreds of leaves.
    key = jax.random.key(jax.random.bits(key, (), jnp.uint32), impl="rbg")
    dummy = jnp.zeros((1, 1), jnp.int32)
    cache = init_cache(cfg, 1, 1, dtype)
    variables = Decoder(cfg, dtype, Kernels(attn="xla", moe="xla")).init(
        key, dummy, dummy, cache.kv, cache.lengths, jnp.ones((1, 1, 1), bool),
        jnp.ones((1,), jnp.int32), (), "absorbed")
    return variables["params"]


_init_target_jit = jax.jit(_init_target, static_argnums=(0, 2))


def _is_concrete(*xs) -> bool:
    return not any(isinstance(x, jax.core.Tracer) for x in xs)


def forward(params, cfg: ModelConfig, tokens, positions, cache: LatentCache, *, visibility=None,
            num_new=None, taps: Sequence[int] = (), attn_mode: str = "absorbed",
            kernels: Kernels | None = None, **kernel_aliases) -> ForwardOut:
    """Run T new tokens per stream against `cache`.

    tokens, positions [S, T] integer; visibility [S, T, T] bool (None: causal among the new tokens);
    num_new [S] integer in [0, T], valid new tokens per stream (None: all T): the first num_new[s]
    of stream s; the routed experts compute only those (the others' slots take no rows of the
    expert GEMMs, and their outputs are not meaningful). New tokens are written at slots
    lengths[s] + t; the returned cache has lengths += num_new. Returns logits [S, T, V] float32,
    the cache, and the hidden states after layers `taps` concatenated [S, T, len(taps) * d]
    (transformers' `hidden_states[i + 1]`: the last layer's is after the final norm).
    kernels: the kernel implementations (config.Kernels; default: "auto" for every operation);
    the keywords attn_impl, moe_impl, attn_balance set one field each (Kernels.ALIASES).
    """
    kernels = Kernels.of(kernels, **kernel_aliases)
    tokens = integer_array("tokens", tokens, jnp)
    positions = integer_array("positions", positions, jnp)
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be [streams, new_tokens], got shape {tokens.shape}")
    s, t = tokens.shape
    if positions.shape != (s, t):
        raise ValueError(f"positions shape {positions.shape} != tokens shape {(s, t)}")
    if len(cache.kv) != cfg.num_hidden_layers or cache.kv[0].shape[0] != s:
        raise ValueError(f"cache holds {len(cache.kv)} layers x {cache.kv[0].shape[0]} streams; "
                         f"expected {cfg.num_hidden_layers} x {s}")
    if visibility is None:
        visibility = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (s, t, t))
    elif visibility.shape != (s, t, t):
        raise ValueError(f"visibility shape {visibility.shape} != {(s, t, t)}")
    if num_new is None:
        num_new = jnp.full((s,), t, jnp.int32)
    else:
        num_new = integer_array("num_new", num_new, jnp)
        if num_new.shape != (s,):
            raise ValueError(f"num_new shape {num_new.shape} != (streams,) = {(s,)}")
        if _is_concrete(num_new) and (np.any(num_new < 0) or np.any(num_new > t)):
            raise ValueError(f"num_new must lie in [0, new_tokens = {t}], got {num_new.tolist()}")
        num_new = num_new.astype(jnp.int32)
    bad_taps = [i for i in taps if not 0 <= i < cfg.num_hidden_layers]
    if bad_taps:
        raise ValueError(f"taps {bad_taps} out of range [0, {cfg.num_hidden_layers})")
    if _is_concrete(tokens, num_new, cache.lengths):
        valid = np.arange(t)[None, :] < np.asarray(num_new)[:, None]
        tok = np.asarray(tokens)
        if np.any(valid & ((tok < 0) | (tok >= cfg.vocab_size))):
            raise ValueError(f"tokens out of vocabulary range [0, {cfg.vocab_size})")
        end = np.asarray(cache.lengths) + np.asarray(num_new)
        if np.any(end > cache.max_len):
            raise ValueError(f"positions beyond the cache: stream lengths + new tokens {end.tolist()} "
                             f"exceed max_len {cache.max_len}")
    if attn_mode not in ("absorbed", "naive"):
        raise ValueError(f"attn_mode must be 'absorbed' or 'naive', got {attn_mode!r}")
    return _apply(params, cfg, tokens, positions, cache, visibility, num_new, tuple(taps), attn_mode,
                  kernels)


@functools.partial(jax.jit, static_argnames=("cfg", "taps", "attn_mode", "kernels"))
def _apply(params, cfg, tokens, positions, cache, visibility, num_new, taps, attn_mode,
           kernels) -> ForwardOut:
    dtype = jax.tree_util.tree_leaves(params["embed_tokens"])[0].dtype
    logits, kv, tap_out = Decoder(cfg, dtype, kernels).apply(
        {"params": params}, tokens, positions, cache.kv, cache.lengths, visibility, num_new,
        taps, attn_mode)
    return ForwardOut(logits=logits, cache=LatentCache(kv=kv, lengths=cache.lengths + num_new),
                      taps=tap_out)


@functools.partial(jax.jit, static_argnames=("cfg", "attn_mode", "kernels"))
def _causal_logits(params, cfg, tokens, attn_mode, kernels):
    s, t = tokens.shape
    dtype = jax.tree_util.tree_leaves(params["embed_tokens"])[0].dtype
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (s, t))
    out = forward(params, cfg, tokens, positions, init_cache(cfg, s, t, dtype), attn_mode=attn_mode,
                  kernels=kernels)
    return out.logits


@functools.partial(jax.jit, static_argnames=("cfg",))
def _routing_choices(params, cfg, tokens):
    s, t = tokens.shape
    dtype = jax.tree_util.tree_leaves(params["embed_tokens"])[0].dtype
    cache = init_cache(cfg, s, t, dtype)
    _, state = Decoder(cfg, dtype, Kernels(attn="xla", moe="xla")).apply(
        {"params": params}, tokens, jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (s, t)),
        cache.kv, cache.lengths, jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (s, t, t)),
        jnp.full((s,), t, jnp.int32), (), "naive",
        capture_intermediates=lambda mdl, _: mdl.name == "post_attention_layernorm",
        mutable=["intermediates"])
    out = {}
    for i in range(cfg.num_hidden_layers):
        if cfg.is_moe_layer(i):
            y = state["intermediates"][f"layers_{i}"]["post_attention_layernorm"]["__call__"][0]
            gate = params[f"layers_{i}"]["mlp"]["gate"]
            logits = router_logits(y.reshape(s * t, -1), gate["kernel"])
            out[i] = route_choice(logits, gate["e_score_correction_bias"], cfg)[1].reshape(s, t, -1)
    return out


def routing_choices(params, cfg: ModelConfig, tokens) -> dict[int, jax.Array]:
    """Plain causal forward (xla kernels) of tokens [B, T] -> {layer: choice [B, T, E] float32} for
    every MoE layer: the selection scores (`route_choice`) whose top num_experts_per_tok are each
    token's experts. The gap between a token's k-th and (k+1)-th score is how near its expert
    set is to a tie (`ddtree_jax.bench.parity` judges differences of greedy tokens by it)."""
    tokens = integer_array("tokens", tokens, jnp).astype(jnp.int32)
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be [batch, time], got shape {tokens.shape}")
    return _routing_choices(params, cfg, tokens)


def target_logits(params, cfg: ModelConfig, tokens, *, attn_mode: str = "naive",
                  kernels: Kernels | None = None, **kernel_aliases):
    """Plain causal forward: tokens [B, T] integer -> float32 logits [B, T, V] (positions 0..T-1).
    kernels / kernel_aliases as `forward`'s."""
    kernels = Kernels.of(kernels, **kernel_aliases)
    tokens = integer_array("tokens", tokens, jnp).astype(jnp.int32)
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be [batch, time], got shape {tokens.shape}")
    if _is_concrete(tokens) and (np.any(np.asarray(tokens) < 0) or np.any(np.asarray(tokens) >= cfg.vocab_size)):
        raise ValueError(f"tokens out of vocabulary range [0, {cfg.vocab_size})")
    return _causal_logits(params, cfg, tokens, attn_mode, kernels)
