"""DFlash block-diffusion drafter (z-lab `dflash/model.py`), Flax Linen used functionally.

A few Qwen3-style decoder layers (GQA, per-head q_norm/k_norm, rotate-half RoPE, SwiGLU) read a
block `[last accepted token, MASK x (b-1)]` embedded with the target's embedding. The context is
`hidden_norm(fc(concat of the target's tapped hidden states))`; every layer projects it with its own
k_proj/v_proj (k_norm, then RoPE at the context positions) and prepends it to the block's own keys
and values. Attention is non-causal over context + block. The drafter has no embedding or lm_head
of its own: it uses the target's `embed_tokens/embedding` and `lm_head/kernel`.
Both projections (the block's input_layernorm + q/k/v, the context's hidden_norm + k/v, each with
its head norms and RoPE) are the registry's "drafter_qkv" operation, and the attention is its
"drafter_attention": `attn_impl` picks the implementation of both.

Two forms share the same layers:
- `drafter_hidden`: the reference forward, no cache (the whole context is given).
- `append_context` + `draft_block`: the engine's form. Context keys/values live in a
  `DrafterCache` per stream and grow as tokens are accepted; the block's keys/values are
  recomputed every step and never stored.

Params pytree (kernels `[in, out]`):
  fc/kernel [len(target_layer_ids)*d, d]; hidden_norm/scale [d]; norm/scale [d]
  layers_{i}/{input_layernorm,post_attention_layernorm}/scale [d]
  layers_{i}/self_attn/q_proj/kernel [d, H*hd]; {k_proj,v_proj}/kernel [d, KV*hd]; o_proj/kernel [H*hd, d]
  layers_{i}/self_attn/{q_norm,k_norm}/scale [hd]
  layers_{i}/mlp/{gate_proj,up_proj}/kernel [d, I]; mlp/down_proj/kernel [I, d]
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from ddtree_jax import rope
from ddtree_jax import sharding
from ddtree_jax.config import DrafterConfig
from ddtree_jax.model import Linear, RMSNorm, SwiGLU
from pallas_kernels.checks import concrete
from pallas_kernels.drafter_attention import drafter_attention
from pallas_kernels.drafter_qkv import drafter_qkv

Dtype = Any


def _taps_width(cfg: DrafterConfig) -> int:
    return len(cfg.target_layer_ids) * cfg.hidden_size


class NormScale(nn.Module):
    """An RMSNorm's weight `scale` [dim], made at setup so a fused kernel can read it; the norm
    itself runs inside "drafter_qkv"."""

    dim: int
    param_dtype: Dtype = jnp.float32

    def setup(self):
        self.scale = self.param("scale", nn.initializers.ones, (self.dim,), self.param_dtype)


class DFlashAttention(nn.Module):
    """GQA with per-head q_norm/k_norm; block queries attend to context + block keys, non-causal."""

    cfg: DrafterConfig
    param_dtype: Dtype = jnp.float32
    attn_impl: str = "xla"

    def setup(self):
        c = self.cfg
        d, q, kv = c.hidden_size, c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        self.q_proj = Linear(d, q, self.param_dtype)
        self.k_proj = Linear(d, kv, self.param_dtype)
        self.v_proj = Linear(d, kv, self.param_dtype)
        self.o_proj = Linear(q, d, self.param_dtype)
        self.q_norm = NormScale(c.head_dim, self.param_dtype)
        self.k_norm = NormScale(c.head_dim, self.param_dtype)

    def project(self, x, positions, norm, with_q: bool):
        """x [B,T,d] (RMSNorm'd by `norm` [d] first), positions [B,T] -> (q [B,T,H,hd] or None,
        k, v [B,T,KV,hd]): q_norm/k_norm, then RoPE at the positions ("drafter_qkv")."""
        c = self.cfg
        return drafter_qkv(x, positions, self.q_proj.weight() if with_q else None,
                           self.k_proj.weight(), self.v_proj.weight(),
                           self.q_norm.scale if with_q else None, self.k_norm.scale,
                           rope.inv_freq(c.head_dim, c.rope_theta), norm=norm, eps=c.rms_norm_eps,
                           impl=self.attn_impl)

    def kv(self, x, positions, norm):
        """x [B,T,d] (RMSNorm'd by `norm` [d] first), positions [B,T] -> k, v [B,T,KV,hd]."""
        return self.project(x, positions, norm, with_q=False)[1:]

    def __call__(self, x, positions, ctx_k, ctx_v, ctx_lengths, norm, layer: int):
        """x [B,b,d] the block (RMSNorm'd by `norm` [d] first), positions [B,b]; ctx_k/ctx_v
        [L,B,KV,N,hd], the stacked cache, of which layer `layer`'s slots < ctx_lengths [B] hold
        the context -> [B,b,d]. The attention itself is the registry's "drafter_attention" (which
        reads the stack in place): products in ctx_k's dtype with float32 accumulation, softmax
        over context + block in float32."""
        c = self.cfg
        bsz, b, _ = x.shape
        q, k_blk, v_blk = self.project(x, positions, norm, with_q=True)
        o = drafter_attention(q.astype(ctx_k.dtype), ctx_k, ctx_v, ctx_lengths, k_blk, v_blk,
                              scale=c.head_dim ** -0.5, layer=layer, impl=self.attn_impl)
        return self.o_proj(o.reshape(bsz, b, -1).astype(x.dtype))


class DFlashLayer(nn.Module):
    """h = x + attn(input_layernorm(x), context); out = h + mlp(post_attention_layernorm(h))."""

    cfg: DrafterConfig
    param_dtype: Dtype = jnp.float32
    attn_impl: str = "xla"

    def setup(self):
        c = self.cfg
        self.input_layernorm = NormScale(c.hidden_size, self.param_dtype)
        self.self_attn = DFlashAttention(c, self.param_dtype, self.attn_impl)
        self.post_attention_layernorm = RMSNorm(c.rms_norm_eps, self.param_dtype)
        self.mlp = SwiGLU(c.hidden_size, c.intermediate_size, self.param_dtype)

    def context_kv(self, ctx, positions, norm):
        return self.self_attn.kv(ctx, positions, norm)

    def __call__(self, x, positions, ctx_k, ctx_v, ctx_lengths, layer: int):
        """ctx_k/ctx_v: the stacked [L,B,KV,N,hd] cache; this layer reads index `layer`."""
        h = x + self.self_attn(x, positions, ctx_k, ctx_v, ctx_lengths, self.input_layernorm.scale,
                               layer)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDrafter(nn.Module):
    """The drafter: `context_kv` (taps -> per-layer context K/V) and `__call__` (block -> hidden);
    attn_impl: the "drafter_qkv" and "drafter_attention" implementation its layers use ("xla",
    the default, is the one with gradients)."""

    cfg: DrafterConfig
    param_dtype: Dtype = jnp.float32
    attn_impl: str = "xla"

    def setup(self):
        c = self.cfg
        self.fc = Linear(_taps_width(c), c.hidden_size, self.param_dtype)
        self.hidden_norm = NormScale(c.hidden_size, self.param_dtype)
        self.layers = [DFlashLayer(c, self.param_dtype, self.attn_impl)
                       for _ in range(c.num_hidden_layers)]
        self.norm = RMSNorm(c.rms_norm_eps, self.param_dtype)

    def context_kv(self, target_hidden, positions):
        """target_hidden [B,n,len(ids)*d] raw taps, positions [B,n] -> k, v [L,B,KV,n,hd]."""
        ctx = self.fc(target_hidden)            # each layer's projection applies hidden_norm
        ks, vs = zip(*(layer.context_kv(ctx, positions, self.hidden_norm.scale)
                       for layer in self.layers))
        return jnp.stack(ks).swapaxes(2, 3), jnp.stack(vs).swapaxes(2, 3)

    def __call__(self, noise_embedding, positions, ctx_k, ctx_v, ctx_lengths):
        """noise_embedding [B,b,d], positions [B,b], ctx_k/ctx_v [L,B,KV,N,hd], ctx_lengths [B]
        -> final-normed hidden [B,b,d]."""
        x = noise_embedding
        for i, layer in enumerate(self.layers):
            x = layer(x, positions, ctx_k, ctx_v, ctx_lengths, i)
        return self.norm(x)


def init_drafter(cfg: DrafterConfig, key: jax.Array, dtype: Dtype = jnp.float32, *,
                 mesh: jax.sharding.Mesh | None = None) -> dict:
    """Random drafter params (the pytree `load_drafter` returns) in `dtype`: kernels
    N(0, 1/fan_in), norm scales 1. The tree comes from the modules; the values from one draw.
    With `mesh`, every leaf is created directly in its shards (`sharding.param_shardings`)."""
    if mesh is None:
        return _init_drafter_jit(cfg, key, dtype)
    out = sharding.param_shardings(jax.eval_shape(functools.partial(_init_drafter, cfg, dtype=dtype),
                                                  key), mesh)
    return jax.jit(_init_drafter, static_argnums=(0, 2), out_shardings=out)(cfg, key, dtype)


def _init_drafter(cfg: DrafterConfig, key: jax.Array, dtype: Dtype) -> dict:
    model = DFlashDrafter(cfg, dtype)

    def run(m, taps, x, pos):
        k, v = m.context_kv(taps, pos)
        return m(x, pos, k, v, jnp.full(pos.shape[:1], pos.shape[1], jnp.int32))

    shapes = jax.eval_shape(functools.partial(model.init, method=run), key,
                            jnp.zeros((1, 1, _taps_width(cfg)), dtype),
                            jnp.zeros((1, 1, cfg.hidden_size), dtype), jnp.zeros((1, 1), jnp.int32))
    leaves, tree = jax.tree.flatten(shapes["params"])
    draw = jax.random.normal(key, (sum(math.prod(x.shape) for x in leaves if x.ndim == 2),))
    out, start = [], 0
    for leaf in leaves:
        if leaf.ndim == 1:                                   # RMSNorm scale
            out.append(jnp.ones(leaf.shape, leaf.dtype))
            continue
        size = math.prod(leaf.shape)
        out.append((draw[start:start + size].reshape(leaf.shape) * leaf.shape[0] ** -0.5)
                   .astype(leaf.dtype))
        start += size
    return jax.tree.unflatten(tree, out)


_init_drafter_jit = jax.jit(_init_drafter, static_argnums=(0, 2))


def _check_shape(name: str, x, expected: tuple) -> None:
    """expected: ints or None (any size); raises ValueError naming `name`."""
    ok = x.ndim == len(expected) and all(e is None or e == s for s, e in zip(x.shape, expected))
    if not ok:
        want = "[" + ", ".join("*" if e is None else str(e) for e in expected) + "]"
        raise ValueError(f"{name} has shape {list(x.shape)}, expected {want}")


def drafter_hidden(params: dict, cfg: DrafterConfig, target_hidden: jax.Array,
                   noise_embedding: jax.Array, positions: jax.Array) -> jax.Array:
    """The z-lab forward without a cache.

    target_hidden [B,n,len(target_layer_ids)*d] raw taps of the n context tokens,
    noise_embedding [B,b,d] the embedded block, positions [B,n+b] (context first, then block)
    -> final-normed hidden [B,b,d].
    """
    bsz, n = target_hidden.shape[:2]
    _check_shape("target_hidden", target_hidden, (None, None, _taps_width(cfg)))
    _check_shape("noise_embedding", noise_embedding, (bsz, None, cfg.hidden_size))
    _check_shape("positions", positions, (bsz, n + noise_embedding.shape[1]))
    model = DFlashDrafter(cfg)
    k, v = model.apply({"params": params}, target_hidden, positions[:, :n], method="context_kv")
    return model.apply({"params": params}, noise_embedding, positions[:, n:], k, v,
                       jnp.full((bsz,), n, jnp.int32))


class DrafterCache(NamedTuple):
    """Context keys/values of every drafter layer, one row per stream.

    k, v: [L, S, KV, max_ctx, hd] (k already k_normed and roped at its token's position; head-major
    so the drafter's attention reads it without a transposed copy);
    lengths: [S] int32, slots `< lengths[s]` hold stream s's context.
    """

    k: jax.Array
    v: jax.Array
    lengths: jax.Array


def init_drafter_cache(cfg: DrafterConfig, num_streams: int, max_ctx: int,
                       dtype: Dtype = jnp.bfloat16) -> DrafterCache:
    """An empty cache with room for `max_ctx` context tokens per stream."""
    shape = (cfg.num_hidden_layers, num_streams, cfg.num_key_value_heads, max_ctx, cfg.head_dim)
    return DrafterCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype),
                        jnp.zeros((num_streams,), jnp.int32))


def append_context(params: dict, cfg: DrafterConfig, cache: DrafterCache, target_hidden: jax.Array,
                   positions: jax.Array, num_new: jax.Array, attn_impl: str = "auto") -> DrafterCache:
    """Fuse and project new context tokens into the cache.

    target_hidden [S,n,len(ids)*d] raw taps, positions [S,n], num_new [S] int32 (<= n): token t of
    stream s goes to slot lengths[s] + t when t < num_new[s]; lengths advance by num_new. Outside
    jit, overflowing the cache raises; under jit the caller must keep lengths + num_new <= max_ctx.
    attn_impl: the "drafter_qkv" implementation of the projection (pallas_kernels.registry).
    """
    num_streams, max_ctx = cache.lengths.shape[0], cache.k.shape[3]
    n = positions.shape[1]
    _check_shape("target_hidden", target_hidden, (num_streams, n, _taps_width(cfg)))
    _check_shape("positions", positions, (num_streams, n))
    _check_shape("num_new", num_new, (num_streams,))
    new, lengths = concrete(num_new), concrete(cache.lengths)
    if new is not None and ((new < 0) | (new > n)).any():
        raise ValueError(f"num_new {new.tolist()} must lie in [0, {n}]")
    if new is not None and lengths is not None and (lengths + new > max_ctx).any():
        raise ValueError(f"drafter cache overflow: lengths {lengths.tolist()} + num_new "
                         f"{new.tolist()} exceeds max_ctx={max_ctx}")
    k, v = DFlashDrafter(cfg, attn_impl=attn_impl).apply({"params": params}, target_hidden,
                                                         positions, method="context_kv")  # [L,S,KV,n,hd]
    t = jnp.arange(n)
    slot = jnp.where(t < num_new[:, None], cache.lengths[:, None] + t, max_ctx)  # max_ctx: dropped
    row = jnp.arange(num_streams)[:, None]
    # c[:, row, :, slot] is laid out [S, n, L, KV, hd] (separated index arrays lead)
    put = lambda c, new: sharding.constrain(
        c.at[:, row, :, slot].set(new.transpose(1, 3, 0, 2, 4).astype(c.dtype), mode="drop"),
        sharding.DRAFTER_CACHE)
    return DrafterCache(put(cache.k, k), put(cache.v, v),
                        cache.lengths + num_new.astype(cache.lengths.dtype))


def draft_block(params: dict, cfg: DrafterConfig, cache: DrafterCache, noise_embedding: jax.Array,
                block_positions: jax.Array, attn_impl: str = "auto") -> jax.Array:
    """noise_embedding [S,b,d], block_positions [S,b] -> final-normed hidden [S,b,d].

    The block attends to context slots < lengths[s] and to the whole block (non-causal); its own
    keys/values are not stored. Rows 1..b-1 of the result, through `draft_logits`, are the
    drafts for depths 1..b-1 (row 0 is the anchor token). attn_impl: the "drafter_qkv" and
    "drafter_attention" implementation (pallas_kernels.registry).
    """
    num_streams = cache.lengths.shape[0]
    _check_shape("noise_embedding", noise_embedding, (num_streams, None, cfg.hidden_size))
    _check_shape("block_positions", block_positions, (num_streams, noise_embedding.shape[1]))
    return DFlashDrafter(cfg, attn_impl=attn_impl).apply(
        {"params": params}, noise_embedding, block_positions, cache.k, cache.v, cache.lengths)


def block_embedding(target_params: dict, cfg: DrafterConfig, anchor_tokens: jax.Array) -> jax.Array:
    """anchor_tokens [S] (last accepted token) -> embedded block [S, block_size, d]:
    `[anchor, MASK x (block_size-1)]` through the target's `embed_tokens/embedding`."""
    table = target_params["embed_tokens"]["embedding"]
    mask = jnp.full((anchor_tokens.shape[0], cfg.block_size - 1), cfg.mask_token_id, jnp.int32)
    return sharding.vocab_embed(table, jnp.concatenate([anchor_tokens.astype(jnp.int32)[:, None], mask],
                                                        axis=1))


def draft_logits(target_params: dict, hidden: jax.Array) -> jax.Array:
    """Final-normed drafter hidden [..., d] -> float32 logits [..., V] via the target's lm_head."""
    w = target_params["lm_head"]["kernel"]
    logits = jnp.einsum("...d,dv->...v", hidden.astype(w.dtype), w, preferred_element_type=jnp.float32)
    return sharding.constrain(logits, ("streams",) + (None,) * (logits.ndim - 2) + ("vocab",))
