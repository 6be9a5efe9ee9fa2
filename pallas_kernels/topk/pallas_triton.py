"""Pallas:Triton top-k by threshold selection: x is read once in full, then only ~k*G elements.

Row x [V] is viewed as M = ceil(V/G) groups of G consecutive entries (G a power of two <= 16 with
M >= 2k where V allows). Four kernels:
  1. group max  (grid R x M/blk): gm [R, M] = per-group max, plus per-block (max, sum exp) partials
                                  for the row logsumexp. The only full pass over x.
  2. group pick (grid R):         the k groups first in (gm desc, group asc) order. They hold the
                                  whole top-k: an element outside them is preceded by each of
                                  those k groups' maxima. Exactly k group ids, ascending.
  3. candidate pick (grid R):     gathers the k*G candidates and keeps exactly k: all above the
                                  k-th largest value t, then the lowest-index entries equal to t.
  4. rank sort  (grid R x k/blk): each kept entry's rank among the k (value desc, index asc) is its
                                  output slot.
Order statistics are exact: floats map to int32 keys with the same order (-0.0 == 0.0) and the
k-th largest key is built bit by bit from 32 counting passes over data held in registers.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels import registry
from pallas_kernels.pallas_compat import interpret_mode, pl, plgpu

_INT_MIN = -(2**31)
_CHUNK = 8192  # entries of x per program of the group-max pass
_RANK_BLOCK = 128  # rows and columns of one comparison tile in the rank sort


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def group_size(V: int, k: int) -> int:
    """G: the largest power of two <= 16 leaving at least 2k groups (1 if V < 4k)."""
    g = 16
    while g > 1 and V // g < 2 * k:
        g //= 2
    return g


def _keys(v):
    """float32 -> int32 keys whose signed order is the float order, with -0.0 == 0.0."""
    bits = jax.lax.bitcast_convert_type(v, jnp.int32)
    return jnp.where(v == 0, 0, bits ^ ((bits >> 31) & 0x7FFFFFFF))


def _kth_largest_key(keys, valid, k: int):
    """The k-th largest of keys[valid] (by multiplicity): bit by bit, 32 counting passes."""

    def body(i, biased):
        cand = biased | jnp.left_shift(jnp.int32(1), 31 - i)
        count = jnp.sum(jnp.where(valid & (keys >= (cand ^ _INT_MIN)), 1, 0))
        return jnp.where(count >= k, cand, biased)

    return jax.lax.fori_loop(0, 32, body, jnp.int32(0)) ^ _INT_MIN


def _first_k_mask(keys, valid, t, k: int, exclusive_rank):
    """Mask of exactly k entries: keys > t, then the first ties (keys == t) in index order."""
    above = valid & (keys > t)
    tie = valid & (keys == t)
    need = k - jnp.sum(jnp.where(above, 1, 0))
    return above | (tie & (exclusive_rank(tie) < need))


def _exclusive_cumsum_1d(m):
    m = m.astype(jnp.int32)
    return jnp.cumsum(m) - m


def _exclusive_cumsum_2d(m):
    """Row-major exclusive prefix count of a [A, B] mask."""
    m = m.astype(jnp.int32)
    within = jnp.cumsum(m, axis=1)
    totals = jnp.sum(m, axis=1)
    before_row = jnp.cumsum(totals) - totals
    return before_row[:, None] + within - m


def _group_max_kernel(x_ref, gm_ref, *lse_refs, num_groups: int, block: int):
    r, c = pl.program_id(0), pl.program_id(1)
    ok = c * block + jnp.arange(block) < num_groups
    x = plgpu.load(x_ref.at[r, pl.ds(c * block, block), :], mask=ok[:, None], other=-jnp.inf)
    gm = jnp.max(x, axis=1)
    plgpu.store(gm_ref.at[r, pl.ds(c * block, block)], gm)
    if not lse_refs:
        return
    pm_ref, ps_ref = lse_refs
    m = jnp.max(gm)
    m_safe = jnp.where(m == -jnp.inf, 0.0, m)
    plgpu.store(pm_ref.at[r, pl.ds(c, 1)], jnp.full((1,), m))
    plgpu.store(ps_ref.at[r, pl.ds(c, 1)], jnp.full((1,), jnp.sum(jnp.exp(x - m_safe))))


def _group_pick_kernel(gm_ref, gid_ref, *, num_groups: int, padded: int, k: int):
    r = pl.program_id(0)
    g = jnp.arange(padded)
    valid = g < num_groups
    keys = _keys(plgpu.load(gm_ref.at[r, pl.ds(0, padded)], mask=valid, other=0.0))
    t = _kth_largest_key(keys, valid, k)
    sel = _first_k_mask(keys, valid, t, k, _exclusive_cumsum_1d)
    pos = jnp.where(sel, _exclusive_cumsum_1d(sel), k + g)  # unselected: distinct, out of range
    plgpu.store(gid_ref.at[r, pos], g, mask=sel)


def _candidate_pick_kernel(x_ref, gid_ref, v_ref, i_ref, *, k: int, kp: int, g: int):
    r = pl.program_id(0)
    row_ok = jnp.arange(kp) < k
    gid = plgpu.load(gid_ref.at[r, pl.ds(0, kp)], mask=row_ok, other=0)
    x = plgpu.load(x_ref.at[r, gid[:, None], jnp.arange(g)[None, :]], mask=row_ok[:, None],
                   other=-jnp.inf)
    idx = gid[:, None] * g + jnp.arange(g)[None, :]
    valid = jnp.broadcast_to(row_ok[:, None], (kp, g))
    keys = _keys(x)
    t = _kth_largest_key(keys, valid, k)
    sel = _first_k_mask(keys, valid, t, k, _exclusive_cumsum_2d)
    pos = jnp.where(sel, _exclusive_cumsum_2d(sel), k + jnp.arange(kp)[:, None] * g
                    + jnp.arange(g)[None, :])
    plgpu.store(v_ref.at[r, pos], x, mask=sel)
    plgpu.store(i_ref.at[r, pos], idx, mask=sel)


def _rank_sort_kernel(v_ref, i_ref, _v0_ref, _i0_ref, vo_ref, io_ref, *, k: int, kp: int,
                      block: int):
    r, c = pl.program_id(0), pl.program_id(1)
    mine = c * block + jnp.arange(block) < k
    v = plgpu.load(v_ref.at[r, pl.ds(c * block, block)], mask=mine, other=0.0)
    idx = plgpu.load(i_ref.at[r, pl.ds(c * block, block)], mask=mine, other=0)
    key = _keys(v)

    def body(j, rank):
        theirs = j * block + jnp.arange(block) < k
        vj = plgpu.load(v_ref.at[r, pl.ds(j * block, block)], mask=theirs, other=0.0)
        ij = plgpu.load(i_ref.at[r, pl.ds(j * block, block)], mask=theirs, other=0)
        kj = _keys(vj)
        before = (kj[None, :] > key[:, None]) | ((kj[None, :] == key[:, None])
                                                  & (ij[None, :] < idx[:, None]))
        return rank + jnp.sum(jnp.where(before & theirs[None, :], 1, 0), axis=1)

    rank = jax.lax.fori_loop(0, kp // block, body, jnp.zeros((block,), jnp.int32))
    rank = jnp.where(mine, rank, k + jnp.arange(block))
    plgpu.store(vo_ref.at[r, rank], v, mask=mine)
    plgpu.store(io_ref.at[r, rank], idx, mask=mine)


def _params(num_warps: int):
    return plgpu.CompilerParams(num_warps=num_warps, num_stages=1)


@functools.partial(jax.jit, static_argnames=("k", "with_lse"))
def _topk(x: jax.Array, k: int, with_lse: bool):
    """x [R, V] -> (values [R, k] desc, indices [R, k] int32, lse [R] or None)."""
    x = x.astype(jnp.float32)
    R, V = x.shape
    g = group_size(V, k)
    M = -(-V // g)
    if M * g != V:  # only when V is not a multiple of G: one padding copy
        x = jnp.pad(x, ((0, 0), (0, M * g - V)), constant_values=-jnp.inf)
    x3 = x.reshape(R, M, g)
    interpret = interpret_mode()
    blk = min(_pow2_at_least(M), max(1, _CHUNK // g))
    nblk = -(-M // blk)
    gm, *partials = pl.pallas_call(
        functools.partial(_group_max_kernel, num_groups=M, block=blk),
        out_shape=(jax.ShapeDtypeStruct((R, nblk * blk), jnp.float32),)
        + (jax.ShapeDtypeStruct((R, nblk), jnp.float32),) * (2 if with_lse else 0),
        grid=(R, nblk), interpret=interpret, compiler_params=_params(4),
    )(x3)
    lse = None
    if with_lse:
        pm, ps = partials
        row_max = jnp.max(pm, axis=1)
        lse = row_max + jnp.log(jnp.sum(ps * jnp.exp(pm - row_max[:, None]), axis=1))

    mp, kp = _pow2_at_least(M), _pow2_at_least(k)
    warps = lambda n: int(min(16, max(4, n // 1024)))  # noqa: E731
    gid = pl.pallas_call(
        functools.partial(_group_pick_kernel, num_groups=M, padded=mp, k=k),
        out_shape=jax.ShapeDtypeStruct((R, k), jnp.int32),
        grid=(R,), interpret=interpret, compiler_params=_params(warps(mp)),
    )(gm)
    cv, ci = pl.pallas_call(
        functools.partial(_candidate_pick_kernel, k=k, kp=kp, g=g),
        out_shape=(jax.ShapeDtypeStruct((R, k), jnp.float32),
                   jax.ShapeDtypeStruct((R, k), jnp.int32)),
        grid=(R,), interpret=interpret, compiler_params=_params(warps(kp * g)),
    )(x3, gid)
    # Outputs start poisoned (NaN, -1) and are aliased in place: every slot must be written.
    blk = min(kp, _RANK_BLOCK)
    values, indices = pl.pallas_call(
        functools.partial(_rank_sort_kernel, k=k, kp=kp, block=blk),
        out_shape=(jax.ShapeDtypeStruct((R, k), jnp.float32),
                   jax.ShapeDtypeStruct((R, k), jnp.int32)),
        grid=(R, kp // blk), interpret=interpret, compiler_params=_params(4),
        input_output_aliases={2: 0, 3: 1},
    )(cv, ci, jnp.full((R, k), jnp.nan, jnp.float32), jnp.full((R, k), -1, jnp.int32))
    return values, indices, lse


@registry.register("topk_logsumexp", "pallas_triton")
def topk_logsumexp(x: jax.Array, k: int):
    return _topk(x, k, True)


@registry.register("topk", "pallas_triton")
def topk(x: jax.Array, k: int):
    return _topk(x, k, False)[:2]
