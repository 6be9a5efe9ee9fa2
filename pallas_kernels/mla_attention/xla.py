"""Pure-JAX MLA tree-verify attention: online softmax over context chunks, then the tree block.

Memory stays bounded at large shapes: the score tile is [S, Q, H, chunk] float32 with chunk
chosen so it holds at most 2**26 elements; the loop runs only over chunks below max(ctx_lens).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels import registry

_SCORE_ELEMS = 2**26


def _chunk_len(rows: int, num_slots: int) -> int:
    chunk = 4096
    while chunk > 16 and rows * chunk > _SCORE_ELEMS:
        chunk //= 2
    return min(chunk, num_slots)


def _online_update(carry, scores, v):
    """One online-softmax step. scores [S,Q,H,C] f32 (-inf = hidden); v [S,C,v_dim]."""
    m, l, acc = carry
    m_new = jnp.maximum(m, scores.max(axis=-1))
    m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
    p = jnp.exp(scores - m_safe[..., None])
    alpha = jnp.exp(m - m_safe)
    l = alpha * l + p.sum(axis=-1)
    pv = jnp.einsum("sqhc,scv->sqhv", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return m_new, l, alpha[..., None] * acc + pv


def _scores(q, k, scale):
    return jnp.einsum("sqhd,scd->sqhc", q, k, preferred_element_type=jnp.float32) * scale


@registry.register("mla_attention", "xla")
@functools.partial(jax.jit, static_argnames=("scale", "v_dim", "heads_first", "balance"))
def mla_attention_xla(q, kv, ctx_lens, node_mask, *, scale: float, v_dim: int,
                      heads_first: bool = False, q_rope=None, balance: bool = False) -> jax.Array:
    """q [S,Q,H,Dk], kv [S,N,Dk], ctx_lens [S] int32, node_mask [S,Q,W] int32 -> [S,Q,H,v_dim];
    heads_first: q [S,H,Q,Dk] -> [S,H,Q,v_dim]; q_rope: q's last v_dim.. channels given apart;
    balance: the registry's scheduling hint (mla_attention), nothing to schedule here."""
    del balance
    if q_rope is not None:
        q = jnp.concatenate([q, q_rope], axis=-1)
    if heads_first:
        out = mla_attention_xla(q.swapaxes(1, 2), kv, ctx_lens, node_mask, scale=scale, v_dim=v_dim)
        return out.swapaxes(1, 2)
    num_s, num_q, num_h, _ = q.shape
    num_slots = kv.shape[1]
    chunk = _chunk_len(num_s * num_q * num_h, num_slots)
    init = (jnp.full((num_s, num_q, num_h), -jnp.inf, jnp.float32),
            jnp.zeros((num_s, num_q, num_h), jnp.float32),
            jnp.zeros((num_s, num_q, num_h, v_dim), jnp.float32))

    def body(state):
        i, carry = state
        nominal = i * chunk
        start = jnp.minimum(nominal, num_slots - chunk)      # last chunk overlaps, never reads past N
        k = jax.lax.dynamic_slice_in_dim(kv, start, chunk, axis=1)
        pos = start + jnp.arange(chunk)
        valid = (pos[None, :] >= nominal) & (pos[None, :] < ctx_lens[:, None])   # [S, C]
        k = jnp.where(valid[..., None], k, 0)          # stale slots may hold anything, even NaN
        scores = jnp.where(valid[:, None, None, :], _scores(q, k, scale), -jnp.inf)
        return i + 1, _online_update(carry, scores, k[..., :v_dim])

    num_chunks = (jnp.max(ctx_lens) + chunk - 1) // chunk
    _, carry = jax.lax.while_loop(lambda st: st[0] < num_chunks, body, (jnp.int32(0), init))

    t = jnp.arange(num_q)
    slots = jnp.minimum(ctx_lens[:, None] + t[None, :], num_slots - 1)          # [S, Q]
    k_new = jnp.take_along_axis(kv, slots[:, :, None], axis=1)                  # [S, Q, Dk]
    words = jax.lax.bitcast_convert_type(node_mask, jnp.uint32)[:, :, t // 32]  # [S, Q, Q]
    visible = ((words >> (t % 32).astype(jnp.uint32)) & 1).astype(bool)
    k_new = jnp.where(visible.any(axis=1)[..., None], k_new, 0)                 # unseen slots: ignore
    scores = jnp.where(visible[:, :, None, :], _scores(q, k_new, scale), -jnp.inf)
    _, l, acc = _online_update(carry, scores, k_new[..., :v_dim])
    out = jnp.where(l[..., None] > 0, acc / jnp.where(l > 0, l, 1.0)[..., None], 0.0)
    return out.astype(q.dtype)
