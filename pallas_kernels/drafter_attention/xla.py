"""Pure-JAX drafter block attention: GQA scores against the context and the block, one softmax."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels import registry


@registry.register("drafter_attention", "xla")
def drafter_attention_xla(q, ctx_k, ctx_v, ctx_lengths, k_blk, v_blk, *, scale: float,
                          layer: int | None = None) -> jax.Array:
    """See the package docstring. Products in ctx_k's dtype with float32 accumulation; softmax in
    float32. The context is head-major, so both context products are plain batched GEMMs over
    (B, KV) with no transposed copy of it."""
    if layer is not None:
        ctx_k, ctx_v = ctx_k[layer], ctx_v[layer]
    bsz, b, h, hd = q.shape
    kvh, dt = ctx_k.shape[1], ctx_k.dtype
    q = q.astype(dt).reshape(bsz, b, kvh, h // kvh, hd)           # query head h -> kv head h // G
    dot = functools.partial(jnp.einsum, preferred_element_type=jnp.float32)
    s_ctx = dot("bqkgd,bknd->bkgqn", q, ctx_k)
    seen = jnp.arange(ctx_k.shape[2])[None, :] < ctx_lengths[:, None]             # [B, N]
    s_ctx = jnp.where(seen[:, None, None, None, :], s_ctx, -jnp.inf)
    ctx_v = jnp.where(seen[:, None, :, None], ctx_v, 0)       # stale slots may hold anything, even NaN
    s_blk = dot("bqkgd,bnkd->bkgqn", q, k_blk.astype(dt))
    p = jax.nn.softmax(jnp.concatenate([s_ctx, s_blk], axis=-1) * scale, axis=-1)
    p, n = p.astype(dt), ctx_k.shape[2]
    o = (dot("bkgqn,bknd->bqkgd", p[..., :n], ctx_v)
         + dot("bkgqn,bnkd->bqkgd", p[..., n:], v_blk.astype(dt)))
    return o.reshape(bsz, b, h, hd)
