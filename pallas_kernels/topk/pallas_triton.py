"""Pallas:Triton top-k by threshold selection: x is read once in full, then only ~k*G elements.

Row x [V] is viewed as M = ceil(V/G) groups of G consecutive entries (G a power of two <= 16 with
M >= 2k where V allows). Three kernels:
  1. group max (grid R x M/blk): gm [R, M] = per-group max (in x's dtype: exact, and half the
                                 bytes for bf16), plus per-block (max, sum exp) partials for the
                                 row logsumexp. The only full pass over x.
  2. select    (grid R):         one program per row, two steps with a barrier between them:
     groups:   a superset of the k groups first in (gm desc, group asc) order, at most
               group_cap*kp of them (kp = k rounded up to a power of two). Those k groups hold the
               whole top-k: an element outside them is preceded by each of their maxima.
     elements: their first k..elem_cap*kp elements in (value desc, index asc) order, written
               densely in index order with their count.
  3. rank      (grid R x candidate blocks): each candidate's rank among its row's by pairwise
               counting, many programs per row; the first k are the output, in order.
Every selection keeps a set that is a prefix of the (key desc, position asc) order: all keys > t
plus the keys == t before a cut, found by bisection over order-preserving int32 keys (-0.0 ==
0.0), stopping as soon as the set size lies in [k, cap] (`superset`). Sets are compacted in
position order with an exclusive cumsum and scattered through global scratch, so a later step
reads them densely; the ranking then needs no tie-break beyond the position. Exact for any input
without NaN; data-dependent loop counts only change the time.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from pallas_kernels import registry
from pallas_kernels.pallas_compat import interpret_mode, pl, plgpu
from pallas_kernels.selection import (at, barrier, exclusive_cumsum, in_superset, key_shift, keys,
                                      pow2_at_least, superset)

def group_size(V: int, k: int) -> int:
    """G: the largest power of two <= 16 leaving at least 2k groups (1 if V < 4k)."""
    g = 16
    while g > 1 and V // g < 2 * k:
        g //= 2
    return g


def _group_max_kernel(x_ref, gm_ref, *lse_refs, num_groups: int, block: int):
    r, c = pl.program_id(0), pl.program_id(1)
    ok = c * block + jnp.arange(block) < num_groups
    x = plgpu.load(x_ref.at[r, pl.ds(c * block, block), :], mask=ok[:, None],
                   other=-jnp.inf).astype(jnp.float32)
    gm = jnp.max(x, axis=1)
    plgpu.store(gm_ref.at[r, pl.ds(c * block, block)], gm.astype(gm_ref.dtype))
    if not lse_refs:
        return
    pm_ref, ps_ref = lse_refs
    m = jnp.max(gm)
    m_safe = jnp.where(m == -jnp.inf, 0.0, m)
    plgpu.store(pm_ref.at[r, pl.ds(c, 1)], jnp.full((1,), m))
    plgpu.store(ps_ref.at[r, pl.ds(c, 1)], jnp.full((1,), jnp.sum(jnp.exp(x - m_safe))))


def _select_kernel(x_ref, gm_ref, *refs, num_groups: int, num_blocks: int, g: int, k: int,
                   shift: int, interpret: bool):
    if num_blocks:
        pm_ref, ps_ref, cv_ref, ci_ref, ne_ref, lse_ref, gsel_ref = refs
    else:
        cv_ref, ci_ref, ne_ref, gsel_ref = refs
    r = pl.program_id(0)
    if num_blocks:  # row logsumexp from the group-max pass's partials
        ok = jnp.arange(pow2_at_least(num_blocks)) < num_blocks
        pm = plgpu.load(pm_ref.at[r, jnp.arange(ok.shape[0])], mask=ok, other=-jnp.inf)
        ps = plgpu.load(ps_ref.at[r, jnp.arange(ok.shape[0])], mask=ok, other=0.0)
        m = jnp.max(pm)
        m_safe = jnp.where(m == -jnp.inf, 0.0, m)      # a row of -inf: lse -inf, not NaN
        plgpu.store(lse_ref.at[pl.ds(r, 1)],
                    jnp.full((1,), m + jnp.log(jnp.sum(ps * jnp.exp(pm - m_safe)))))
    capg = gsel_ref.shape[1]
    # Groups: a prefix of (gm desc, group asc) holding the first k groups, at most capg of them.
    gidx = jnp.arange(pow2_at_least(num_groups))
    gval = gidx < num_groups
    gkey = keys(plgpu.load(gm_ref.at[r, gidx], mask=gval, other=0.0).astype(jnp.float32), shift)
    lo, cut, ng = superset(gkey, gval, gidx, k, capg, n_valid=0 * r + num_groups)
    sel = in_superset(gkey, gval, gidx, lo, cut)
    plgpu.store(gsel_ref.at[r, at(exclusive_cumsum(sel), sel)], gidx, mask=sel)
    barrier(interpret)
    # Elements of those groups (ascending group, so position order = index order): the first
    # k..ce. Each chosen group's max is >= lo, so at least k keys are >= lo.
    ce = cv_ref.shape[1]
    row_ok = jnp.arange(capg) < ng
    gid = plgpu.load(gsel_ref.at[r, jnp.arange(capg)], mask=row_ok, other=0)
    x = plgpu.load(x_ref.at[r, gid[:, None], jnp.arange(g)[None, :]], mask=row_ok[:, None],
                   other=-jnp.inf).astype(jnp.float32)
    idx = gid[:, None] * g + jnp.arange(g)[None, :]
    pos = jnp.arange(capg)[:, None] * g + jnp.arange(g)[None, :]
    valid = jnp.broadcast_to(row_ok[:, None], (capg, g))
    xkey = keys(x, shift)
    lo, cut, ne = superset(xkey, valid, pos, k, ce, lo, n_valid=ng * g)
    sel = in_superset(xkey, valid, pos, lo, cut)
    dst = at(exclusive_cumsum(sel), sel)
    plgpu.store(cv_ref.at[r, dst], x, mask=sel)
    plgpu.store(ci_ref.at[r, dst], idx, mask=sel)
    plgpu.store(ne_ref.at[pl.ds(r, 1)], jnp.full((1,), ne, jnp.int32))


def _rank_kernel(cv_ref, ci_ref, ne_ref, v_ref, i_ref, *, k: int, rows: int, cols: int):
    """Candidates b*rows .. b*rows + rows - 1 of row r: rank among the row's ne by counting over
    column tiles [rows, cols] (one tile when cols covers the list); those ranked < k land at
    their rank."""
    r, b = pl.program_id(0), pl.program_id(1)
    # Every load below is in bounds of the [R, ce] buffers, so none waits for ne: entries past it
    # (unwritten by the select kernel) are read and masked out of the comparisons and stores.
    ne = plgpu.load(ne_ref.at[pl.ds(r, 1)])[0]
    e = b * rows + jnp.arange(rows)
    ok = e < ne
    v = plgpu.load(cv_ref.at[r, e])
    i = plgpu.load(ci_ref.at[r, e])

    def count(t, rank):
        f = t * cols + jnp.arange(cols)
        f_ok = f < ne
        fv = plgpu.load(cv_ref.at[r, f])
        before = jnp.where(f[None, :] < e[:, None], fv[None, :] >= v[:, None],
                           fv[None, :] > v[:, None])
        return rank + jnp.sum(jnp.where(before & f_ok[None, :], 1, 0), axis=1)

    zero = jnp.zeros((rows,), jnp.int32)
    if cols == cv_ref.shape[1]:
        rank = count(0, zero)
    else:
        rank = jax.lax.fori_loop(0, (ne + cols - 1) // cols, count, zero)
    keep = ok & (rank < k)
    plgpu.store(v_ref.at[r, at(rank, keep)], v, mask=keep)
    plgpu.store(i_ref.at[r, at(rank, keep)], i, mask=keep)


class SelectConfig(NamedTuple):
    """Sizes of the top-k kernels; the caps in units of kp = k rounded up to a power of two.

    group_cap: the group step keeps at most group_cap * kp groups (fewer bisection steps when
    larger; more elements in the next step); elem_cap: the element step keeps at most
    elem_cap * kp candidates (1: bisection down to exactly k when k is a power of two; 2: fewer
    bisection steps, four times the pairwise ranking, which the rank kernel spreads over many
    programs); rank_pairs: entries of one comparison tile of the rank kernel, whose programs
    each rank rank_pairs / (elem_cap * kp) candidates against the whole list at once (at least
    one candidate; a longer list is walked in tiles); warps: the select kernel's, 0 picks by the
    largest array; group: G, 0 = `group_size(V, k)`; chunk, chunk_warps: entries of x per program
    of the group-max pass, and its warps.
    """

    group_cap: int = 2
    elem_cap: int = 1
    rank_pairs: int = 8192
    warps: int = 0
    group: int = 0
    chunk: int = 8192
    chunk_warps: int = 4

    def check(self) -> None:
        """Raise ValueError naming the first field the kernel cannot use."""
        pow2 = lambda v: isinstance(v, int) and v >= 1 and v & (v - 1) == 0  # noqa: E731
        for name in ("group_cap", "elem_cap", "rank_pairs", "chunk"):
            if not pow2(getattr(self, name)):
                raise ValueError(f"SelectConfig.{name} must be a power of two >= 1; got "
                                 f"{getattr(self, name)!r}")
        if self.warps not in (0, 1, 2, 4, 8, 16, 32):
            raise ValueError(f"SelectConfig.warps must be 0 (auto) or a power of two <= 32; got "
                             f"{self.warps!r}")
        if self.chunk_warps not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"SelectConfig.chunk_warps must be a power of two <= 32; got "
                             f"{self.chunk_warps!r}")
        if self.group != 0 and not pow2(self.group):
            raise ValueError(f"SelectConfig.group must be 0 (auto) or a power of two; got "
                             f"{self.group!r}")


def _params(num_warps: int):
    return plgpu.CompilerParams(num_warps=num_warps, num_stages=1)


def _warps(n: int) -> int:
    """Warps for a program holding arrays of up to n entries."""
    return int(min(16, max(4, n // 1024)))


def select_config(rows: int, V: int, k: int) -> SelectConfig:
    """The sizes the registered operations use unless SELECT is set: the defaults, except where
    the default group step would keep every group (a small vocabulary, such as V = 2048 with
    K = 64). Then the group step keeps half of them (group_cap 1), and with up to 64 rows the
    element step stops at up to 2 kp candidates (elem_cap 2). Timings: docs/kernels/topk.md."""
    cfg = SelectConfig()
    groups = pow2_at_least(-(-V // group_size(V, k)))
    if cfg.group_cap * pow2_at_least(k) < groups:
        return cfg
    return cfg._replace(group_cap=1, elem_cap=2 if rows <= 64 else 1)


@functools.partial(jax.jit, static_argnames=("k", "with_lse", "cfg"))
def _topk(x: jax.Array, k: int, with_lse: bool, cfg: SelectConfig | None = None):
    """x [R, V] -> (values [R, k] desc, indices [R, k] int32, lse [R] or None), all float32.
    x is read in its own dtype (bf16 logits: half the bytes of the one full pass) and converted in
    registers; float32 holds every bf16/f16 value exactly, so the order is x's own.
    cfg: the kernels' sizes (None: `select_config` for x's shape)."""
    cfg = cfg or select_config(*x.shape, k)
    cfg.check()
    if x.dtype not in (jnp.float32, jnp.bfloat16, jnp.float16):
        x = x.astype(jnp.float32)
    R, V = x.shape
    g = cfg.group or group_size(V, k)
    M = -(-V // g)
    if M * g != V:  # only when V is not a multiple of G: one padding copy
        x = jnp.pad(x, ((0, 0), (0, M * g - V)), constant_values=-jnp.inf)
    x3 = x.reshape(R, M, g)
    interpret = interpret_mode()
    blk = min(pow2_at_least(M), max(1, cfg.chunk // g))
    nblk = -(-M // blk)
    gm, *partials = pl.pallas_call(
        functools.partial(_group_max_kernel, num_groups=M, block=blk),
        out_shape=(jax.ShapeDtypeStruct((R, nblk * blk), x.dtype),)   # a max of x is exact in x's dtype
        + (jax.ShapeDtypeStruct((R, nblk), jnp.float32),) * (2 if with_lse else 0),
        grid=(R, nblk), interpret=interpret, compiler_params=_params(cfg.chunk_warps),
    )(x3)
    kp = pow2_at_least(k)
    capg = min(cfg.group_cap * kp, pow2_at_least(M))
    ce = min(cfg.elem_cap * kp, capg * g)
    f32, i32 = jnp.float32, jnp.int32
    outs = ((R, ce), f32), ((R, ce), i32), ((R,), i32), *((((R,), f32),) if with_lse else ()), \
        ((R, capg), i32)  # candidates, their indices and count, lse; scratch
    cv, ci, ne, *rest = pl.pallas_call(
        functools.partial(_select_kernel, num_groups=M, num_blocks=nblk if with_lse else 0, g=g,
                          k=k, shift=key_shift(x.dtype), interpret=interpret),
        out_shape=tuple(jax.ShapeDtypeStruct(s, d) for s, d in outs),
        grid=(R,), interpret=interpret,
        compiler_params=_params(cfg.warps or _warps(max(pow2_at_least(M), capg * g))),
    )(x3, gm, *partials)
    rows = max(1, min(ce, cfg.rank_pairs // ce))
    values, indices = pl.pallas_call(
        functools.partial(_rank_kernel, k=k, rows=rows, cols=min(ce, cfg.rank_pairs // rows)),
        out_shape=(jax.ShapeDtypeStruct((R, k), f32), jax.ShapeDtypeStruct((R, k), i32)),
        grid=(R, ce // rows), interpret=interpret, compiler_params=_params(4),
    )(cv, ci, ne)
    return values, indices, rest[0] if with_lse else None


SELECT: SelectConfig | None = None  # the registered operations' kernel sizes (None: select_config;
                                    # read when traced)


@registry.register("topk_logsumexp", "pallas_triton")
def topk_logsumexp(x: jax.Array, k: int):
    return _topk(x, k, True, SELECT)


@registry.register("topk", "pallas_triton")
def topk(x: jax.Array, k: int):
    return _topk(x, k, False, SELECT)[:2]
