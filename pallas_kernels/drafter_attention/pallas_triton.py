"""Pallas:Triton drafter block attention: programs over (stream, KV head, context split).

The program's rows are the (block slot, group head) pairs that read its KV head (b x G, padded to
a power of two >= 16, the smallest M of a Triton dot), so every context K/V tile it loads serves
all of them; in that order a single KV head's rows are q's own [b, H] layout (no transposed copy). The visible context (slots < ctx_lengths[s], a prefix) is cut into `num_splits`
ranges of whole `block_n`-slot tiles, one per program (flash-decoding style), so a single stream
still spreads over several SMs; a program walks only its range's visible tiles, the last split
also the block's own b keys, with an online softmax in float32. One split writes the normalised
rows; several write float32 partials (acc, row max m, row sum l) that an XLA combine merges.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels import registry
from pallas_kernels.pallas_compat import LOG2E, dot_f32, interpret_mode, pl, plgpu

TARGET_PROGRAMS = 128  # default splits: enough (stream, KV head, split) programs to spread the work


def _pow2_at_least(n: int, floor: int = 1) -> int:
    return max(floor, 1 << max(0, (n - 1).bit_length()))


def default_splits(num_programs: int, num_slots: int, block_n: int) -> int:
    """Splits for `num_programs` (stream, KV head) pairs over `num_slots` context slots: up to
    TARGET_PROGRAMS programs in all, at least one tile each."""
    return max(1, min(-(-TARGET_PROGRAMS // num_programs), -(-num_slots // block_n)))


def _update(carry, s, v):
    """One online-softmax step: scores s [M, n] (-inf = hidden), values v [n, hd]."""
    m, l, acc = carry
    m_new = jnp.maximum(m, s.max(axis=1))
    m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
    p = jnp.exp2(s - m_safe[:, None])          # s and m in log2 units (see pallas_compat.LOG2E)
    alpha = jnp.exp2(m - m_safe)
    return m_new, l * alpha + p.sum(axis=1), acc * alpha[:, None] + dot_f32(p.astype(v.dtype), v, 0)


def _kernel(len_ref, q_ref, k_ref, v_ref, kb_ref, vb_ref, *out_refs, scale, rows, rows_pad,
            block_n, split_len, num_splits, b, b_pad):
    split = pl.program_id(2)
    row_ok = jnp.arange(rows_pad) < rows
    q = plgpu.load(q_ref.at[pl.ds(0, rows_pad), :], mask=row_ok[:, None], other=0)
    hd = q.shape[1]
    carry = (jnp.full((rows_pad,), -jnp.inf, jnp.float32), jnp.zeros((rows_pad,), jnp.float32),
             jnp.zeros((rows_pad, hd), jnp.float32))
    lo = split * split_len
    hi = jnp.minimum(lo + split_len, len_ref[()])

    def context_tile(j, carry):
        start = lo + j * block_n
        ok = start + jnp.arange(block_n) < hi
        k = plgpu.load(k_ref.at[pl.ds(start, block_n), :], mask=ok[:, None], other=0)
        v = plgpu.load(v_ref.at[pl.ds(start, block_n), :], mask=ok[:, None], other=0)
        s = jnp.where(ok[None, :], dot_f32(q, k, 1) * scale, -jnp.inf)
        return _update(carry, s, v)

    carry = jax.lax.fori_loop(0, jnp.maximum(hi - lo + block_n - 1, 0) // block_n, context_tile, carry)
    ok = (jnp.arange(b_pad) < b) & (split == num_splits - 1)     # the block's keys: last split
    kb = plgpu.load(kb_ref.at[pl.ds(0, b_pad), :], mask=ok[:, None], other=0)
    vb = plgpu.load(vb_ref.at[pl.ds(0, b_pad), :], mask=ok[:, None], other=0)
    s = jnp.where(ok[None, :], dot_f32(q, kb, 1) * scale, -jnp.inf)
    m, l, acc = _update(carry, s, vb)
    if num_splits == 1:   # the block's keys are always visible, so l > 0
        (o_ref,) = out_refs
        plgpu.store(o_ref.at[pl.ds(0, rows_pad), :], acc / l[:, None], mask=row_ok[:, None])
    else:
        acc_ref, m_ref, l_ref = out_refs
        plgpu.store(acc_ref.at[pl.ds(0, rows_pad), :], acc, mask=row_ok[:, None])
        plgpu.store(m_ref.at[pl.ds(0, rows_pad)], m, mask=row_ok)
        plgpu.store(l_ref.at[pl.ds(0, rows_pad)], l, mask=row_ok)


def _combine(acc, m, l):
    """Partials acc [B,KV,P,R,hd], m (log2 units) and l [B,KV,P,R] -> normalised [B,KV,R,hd]
    float32. The last split saw the block's keys, so every row's max is finite."""
    m_max = m.max(axis=2, keepdims=True)
    w = jnp.exp2(m - m_max)                                  # m = -inf (nothing seen) -> 0
    return (w[..., None] * acc).sum(axis=2) / (w * l).sum(axis=2)[..., None]


@functools.partial(jax.jit, static_argnames=("scale", "layer", "block_n", "num_splits",
                                             "num_warps", "num_stages", "poison"))
def drafter_attention_pallas(q, ctx_k, ctx_v, ctx_lengths, k_blk, v_blk, *, scale: float,
                             layer: int | None = None, block_n: int = 64,
                             num_splits: int | None = None, num_warps: int = 4,
                             num_stages: int = 1, poison: bool = False) -> jax.Array:
    """q [B,b,H,hd], ctx_k/ctx_v [B,KV,N,hd] (or [L,B,KV,N,hd] and `layer`: read in place),
    ctx_lengths [B] int, k_blk/v_blk [B,b,KV,hd] -> float32 [B,b,H,hd]. hd and block_n must be
    powers of two; num_splits None: default_splits. poison=True hands the kernel NaN-filled output
    buffers (aliased), so unwritten rows show."""
    bsz, b, h, hd = q.shape
    kvh, num_slots = ctx_k.shape[-3], ctx_k.shape[-2]
    group = h // kvh
    if hd & (hd - 1) or block_n & (block_n - 1):
        raise ValueError(f"pallas_triton drafter_attention {_NEEDS_POW2}; got head_dim={hd}, block_n={block_n}")
    splits = num_splits or default_splits(bsz * kvh, num_slots, block_n)
    split_len = -(-(-(-num_slots // splits)) // block_n) * block_n
    dt = ctx_k.dtype
    rows = group * b
    rows_pad, b_pad = _pow2_at_least(rows, 16), _pow2_at_least(b, 16)
    # rows of program (s, kv, p): (t, g) -> block slot t, query head kv * G + g (one KV head:
    # q's own layout, so the transposes below are bitcasts)
    q_rows = q.astype(dt).reshape(bsz, b, kvh, group, hd).transpose(0, 2, 1, 3, 4)
    q_rows = q_rows.reshape(bsz, kvh, rows, hd)
    kb, vb = (x.astype(dt).transpose(0, 2, 1, 3) for x in (k_blk, v_blk))     # [B, KV, b, hd]
    head = lambda s, k, p: (s, k, 0, 0)                                        # noqa: E731
    if layer is None:
        cache_spec = pl.BlockSpec((None, None, num_slots, hd), head)
    else:   # the stacked cache, read at `layer` (slicing it first would copy it)
        cache_spec = pl.BlockSpec((None, None, None, num_slots, hd), lambda s, k, p: (layer, s, k, 0, 0))
    in_specs = [pl.BlockSpec((None,), lambda s, k, p: (s,)),
                pl.BlockSpec((None, None, rows, hd), head),
                cache_spec, cache_spec,
                pl.BlockSpec((None, None, b, hd), head),
                pl.BlockSpec((None, None, b, hd), head)]
    if splits == 1:
        out_shape = [jax.ShapeDtypeStruct((bsz, kvh, rows, hd), jnp.float32)]
        out_specs = [pl.BlockSpec((None, None, rows, hd), head)]
    else:
        part = lambda s, k, p: (s, k, p, 0)                                    # noqa: E731
        out_shape = [jax.ShapeDtypeStruct((bsz, kvh, splits, rows, hd), jnp.float32),
                     jax.ShapeDtypeStruct((bsz, kvh, splits, rows), jnp.float32),
                     jax.ShapeDtypeStruct((bsz, kvh, splits, rows), jnp.float32)]
        out_specs = [pl.BlockSpec((None, None, None, rows, hd), lambda s, k, p: (s, k, p, 0, 0)),
                     pl.BlockSpec((None, None, None, rows), part),
                     pl.BlockSpec((None, None, None, rows), part)]
    args = [ctx_lengths.astype(jnp.int32), q_rows, ctx_k, ctx_v, kb, vb]
    kernel = functools.partial(_kernel, scale=scale * LOG2E, rows=rows, rows_pad=rows_pad, block_n=block_n,
                               split_len=split_len, num_splits=splits, b=b, b_pad=b_pad)
    aliases = {}
    if poison:
        aliases = {len(args) + i: i for i in range(len(out_shape))}
        args += [jnp.full(o.shape, jnp.nan, o.dtype) for o in out_shape]
        in_specs += out_specs
        kernel = _drop_aliased_inputs(kernel, len(out_shape))
    outs = pl.pallas_call(
        kernel, grid=(bsz, kvh, splits), in_specs=in_specs, out_specs=out_specs,
        out_shape=out_shape, input_output_aliases=aliases, interpret=interpret_mode(),
        name="drafter_block_attention",
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
    )(*args)
    out = outs[0] if splits == 1 else _combine(*outs)
    return out.reshape(bsz, kvh, b, group, hd).transpose(0, 2, 1, 3, 4).reshape(bsz, b, h, hd)


def _drop_aliased_inputs(kernel, n):
    """The poison buffers arrive as the last n inputs; the kernel writes their aliased outputs."""
    def wrapped(*refs):
        return kernel(*refs[:6], *refs[6 + n:])
    return wrapped


_NEEDS_POW2 = "needs a power-of-two head_dim and block_n"


def supports(q, ctx_k, ctx_v, ctx_lengths, k_blk, v_blk, *, scale: float, layer: int | None = None) -> str | None:
    """Why the registered "pallas_triton" implementation cannot take this call, or None."""
    hd = q.shape[-1]
    return f"{_NEEDS_POW2}; got head_dim={hd}" if hd & (hd - 1) else None


@registry.register("drafter_attention", "pallas_triton", supports=supports)
def _registered(q, ctx_k, ctx_v, ctx_lengths, k_blk, v_blk, *, scale: float,
                layer: int | None = None) -> jax.Array:
    return drafter_attention_pallas(q, ctx_k, ctx_v, ctx_lengths, k_blk, v_blk, scale=scale,
                                    layer=layer)
