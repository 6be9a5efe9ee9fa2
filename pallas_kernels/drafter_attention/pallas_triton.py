"""Pallas:Triton drafter block attention: one program per (stream, KV head).

The program's rows are the (group head, block slot) pairs that read its KV head (G x b, padded to
a power of two >= 16, the smallest M of a Triton dot), so every context K/V tile it loads serves
all of them. It walks the context in `block_n`-slot tiles (slots hidden by ctx_mask score -inf),
then the block's own b keys, with an online softmax in float32, and writes each row once.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels import registry
from pallas_kernels.pallas_compat import interpret_mode, pl, plgpu


def _pow2_at_least(n: int, floor: int = 1) -> int:
    return max(floor, 1 << max(0, (n - 1).bit_length()))


def _dot(a, b, contract_b: int):
    """a [M, K] @ b (contract_b=1: b is [N, K]; 0: b is [K, N]) -> float32 [M, N]."""
    return jax.lax.dot_general(a, b, (((1,), (contract_b,)), ((), ())),
                               preferred_element_type=jnp.float32)


def _update(carry, s, v):
    """One online-softmax step: scores s [M, n] (-inf = hidden), values v [n, hd]."""
    m, l, acc = carry
    m_new = jnp.maximum(m, s.max(axis=1))
    m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
    p = jnp.exp(s - m_safe[:, None])
    alpha = jnp.exp(m - m_safe)
    return m_new, l * alpha + p.sum(axis=1), acc * alpha[:, None] + _dot(p.astype(v.dtype), v, 0)


def _kernel(q_ref, k_ref, v_ref, mask_ref, kb_ref, vb_ref, o_ref, *, scale, rows, rows_pad,
            num_slots, block_n, b, b_pad):
    row_ok = jnp.arange(rows_pad) < rows
    q = plgpu.load(q_ref.at[pl.ds(0, rows_pad), :], mask=row_ok[:, None], other=0)
    hd = q.shape[1]
    carry = (jnp.full((rows_pad,), -jnp.inf, jnp.float32), jnp.zeros((rows_pad,), jnp.float32),
             jnp.zeros((rows_pad, hd), jnp.float32))

    def context_tile(j, carry):
        start = j * block_n
        ok = start + jnp.arange(block_n) < num_slots
        k = plgpu.load(k_ref.at[pl.ds(start, block_n), :], mask=ok[:, None], other=0)
        v = plgpu.load(v_ref.at[pl.ds(start, block_n), :], mask=ok[:, None], other=0)
        seen = plgpu.load(mask_ref.at[pl.ds(start, block_n)], mask=ok, other=0) != 0
        s = jnp.where(seen[None, :], _dot(q, k, 1) * scale, -jnp.inf)
        return _update(carry, s, v)

    carry = jax.lax.fori_loop(0, pl.cdiv(num_slots, block_n), context_tile, carry)
    ok = jnp.arange(b_pad) < b
    kb = plgpu.load(kb_ref.at[pl.ds(0, b_pad), :], mask=ok[:, None], other=0)
    vb = plgpu.load(vb_ref.at[pl.ds(0, b_pad), :], mask=ok[:, None], other=0)
    s = jnp.where(ok[None, :], _dot(q, kb, 1) * scale, -jnp.inf)
    _, l, acc = _update(carry, s, vb)
    plgpu.store(o_ref.at[pl.ds(0, rows_pad), :], acc / l[:, None], mask=row_ok[:, None])


@functools.partial(jax.jit, static_argnames=("scale", "block_n", "num_warps", "num_stages", "poison"))
def drafter_attention_pallas(q, ctx_k, ctx_v, ctx_mask, k_blk, v_blk, *, scale: float,
                             block_n: int = 64, num_warps: int = 4, num_stages: int = 2,
                             poison: bool = False) -> jax.Array:
    """q [B,b,H,hd], ctx_k/ctx_v [B,KV,N,hd], ctx_mask [B,N] bool, k_blk/v_blk [B,b,KV,hd]
    -> float32 [B,b,H,hd]. hd and block_n must be powers of two. poison=True hands the kernel a
    NaN-filled output buffer (aliased), so rows it leaves unwritten show."""
    bsz, b, h, hd = q.shape
    kvh, num_slots = ctx_k.shape[1], ctx_k.shape[2]
    group = h // kvh
    if hd & (hd - 1) or block_n & (block_n - 1):
        raise ValueError(f"pallas_triton drafter_attention needs a power-of-two head_dim and "
                         f"block_n; got head_dim={hd}, block_n={block_n}")
    dt = ctx_k.dtype
    rows = group * b
    rows_pad, b_pad = _pow2_at_least(rows, 16), _pow2_at_least(b, 16)
    # rows of program (s, kv): (g, t) -> query head kv * G + g at block slot t
    q_rows = q.astype(dt).reshape(bsz, b, kvh, group, hd).transpose(0, 2, 3, 1, 4)
    q_rows = q_rows.reshape(bsz, kvh, rows, hd)
    kb, vb = (x.astype(dt).transpose(0, 2, 1, 3) for x in (k_blk, v_blk))     # [B, KV, b, hd]
    mask = ctx_mask.astype(jnp.int32)
    head = lambda s, k: (s, k, 0, 0)                                           # noqa: E731
    in_specs = [pl.BlockSpec((None, None, rows, hd), head),
                pl.BlockSpec((None, None, num_slots, hd), head),
                pl.BlockSpec((None, None, num_slots, hd), head),
                pl.BlockSpec((None, num_slots), lambda s, k: (s, 0)),
                pl.BlockSpec((None, None, b, hd), head),
                pl.BlockSpec((None, None, b, hd), head)]
    out_shape = jax.ShapeDtypeStruct((bsz, kvh, rows, hd), jnp.float32)
    out_spec = pl.BlockSpec((None, None, rows, hd), head)
    args, aliases = [q_rows, ctx_k, ctx_v, mask, kb, vb], {}
    kernel = functools.partial(_kernel, scale=scale, rows=rows, rows_pad=rows_pad,
                               num_slots=num_slots, block_n=block_n, b=b, b_pad=b_pad)
    if poison:
        args.append(jnp.full(out_shape.shape, jnp.nan, out_shape.dtype))
        in_specs.append(out_spec)
        aliases = {6: 0}
        kernel = _drop_poison_input(kernel)
    out = pl.pallas_call(
        kernel, grid=(bsz, kvh), in_specs=in_specs, out_specs=out_spec, out_shape=out_shape,
        input_output_aliases=aliases, interpret=interpret_mode(), name="drafter_block_attention",
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
    )(*args)
    return out.reshape(bsz, kvh, group, b, hd).transpose(0, 3, 1, 2, 4).reshape(bsz, b, h, hd)


def _drop_poison_input(kernel):
    """The poison buffer arrives as the 7th input; the kernel writes its aliased output."""
    def wrapped(*refs):
        return kernel(*refs[:6], refs[7])
    return wrapped


@registry.register("drafter_attention", "pallas_triton")
def _registered(q, ctx_k, ctx_v, ctx_mask, k_blk, v_blk, *, scale: float) -> jax.Array:
    return drafter_attention_pallas(q, ctx_k, ctx_v, ctx_mask, k_blk, v_blk, scale=scale)
