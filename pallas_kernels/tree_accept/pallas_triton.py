"""Pallas:Triton tree_accept: one program per stream.

The walk keeps the current node and, per depth, takes the first node whose parent is the current
node and whose token is the target's choice there (a masked min over the N nodes); it stops at the
first depth with no such child. The program then gathers the path's tokens and taps, loads every
cache layer's accepted rows (slots start + path[p]) and, after a barrier, stores them at start + p:
the loads finish before any store, so a store can never clobber a row another thread still has to
read (a path node's slot may be a lower depth's destination).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels import registry
from pallas_kernels.pallas_compat import interpret_mode, pl, plgpu
from pallas_kernels.selection import barrier, pow2_at_least

TAP_COLUMNS = 512   # taps columns per gather tile


def _kernel(par_ref, tok_ref, post_ref, start_ref, active_ref, taps_ref, *refs, layers: int,
            n: int, d1: int, dk: int, w: int, interpret: bool):
    kv_in = refs[:layers]                       # (then the poisoned outputs' aliases, if any)
    path_ref, len_ref, bonus_ref, ptok_ref, ptaps_ref = refs[-layers - 5:-layers]
    kv_out = refs[-layers:]
    s = pl.program_id(0)
    np_, dp, dkp, wb = pow2_at_least(n), pow2_at_least(d1), pow2_at_least(dk), min(TAP_COLUMNS, pow2_at_least(w))
    node = jnp.arange(np_)
    nok = node < n
    par = plgpu.load(par_ref.at[s, node], mask=nok, other=-1)
    tok = plgpu.load(tok_ref.at[s, node], mask=nok, other=0)
    p = jnp.arange(dp)
    pok = p < d1

    def step(d, c):
        cur, alive, path = c
        want = plgpu.load(post_ref.at[s, cur])
        j = jnp.min(jnp.where((par == cur) & (tok == want) & nok, node, np_))
        found = (j < np_) & (alive > 0)
        return (jnp.where(found, j, cur), jnp.where(found, one, zero),   # both i32: the loop carry
                jnp.where((p == d) & found, j, path))                 # must keep its type

    zero = 0 * s
    one = zero + 1
    cur, _, path = jax.lax.fori_loop(1, d1, step, (zero, one, jnp.where(p == 0, 0, -1)))
    length = jnp.sum(jnp.where(path >= 0, 1, 0))
    plgpu.store(path_ref.at[s, p], path, mask=pok)
    plgpu.store(len_ref.at[pl.ds(s, 1)], jnp.full((1,), length, jnp.int32))
    plgpu.store(bonus_ref.at[pl.ds(s, 1)], jnp.full((1,), plgpu.load(post_ref.at[s, cur]), jnp.int32))
    src = jnp.maximum(path, 0)
    plgpu.store(ptok_ref.at[s, p], plgpu.load(tok_ref.at[s, src], mask=pok, other=0), mask=pok)

    def taps_tile(t, carry):
        col = t * wb + jnp.arange(wb)
        m = pok[:, None] & (col < w)[None, :]
        plgpu.store(ptaps_ref.at[s, p[:, None], col[None, :]],
                    plgpu.load(taps_ref.at[s, src[:, None], col[None, :]], mask=m, other=0), mask=m)
        return carry

    jax.lax.fori_loop(0, pl.cdiv(w, wb), taps_tile, 0)
    active = plgpu.load(active_ref.at[pl.ds(s, 1)])[0]           # int32 0/1
    keep = jnp.where(active > 0, length, 0)
    start = plgpu.load(start_ref.at[pl.ds(s, 1)])[0]
    col = jnp.arange(dkp)
    m = (p < keep)[:, None] & (col < dk)[None, :]
    rows = [plgpu.load(c.at[s, (start + src)[:, None], col[None, :]], mask=m, other=0) for c in kv_in]
    barrier(interpret)
    for c, r in zip(kv_out, rows):
        plgpu.store(c.at[s, (start + p)[:, None], col[None, :]], r, mask=m)


def tree_accept_pallas(tree, tokens, posterior, start, active, kv, taps, *, num_warps: int = 4,
                       poison: bool = False):
    """See the package docstring. poison: the fresh outputs start as -7 / NaN (tests: every
    element must be written)."""
    s, n = tree.parents.shape
    d1, layers = tree.max_depth + 1, len(kv)
    w = taps.shape[2]
    i32 = jnp.int32
    outs = (jax.ShapeDtypeStruct((s, d1), i32), jax.ShapeDtypeStruct((s,), i32),
            jax.ShapeDtypeStruct((s,), i32), jax.ShapeDtypeStruct((s, d1), i32),
            jax.ShapeDtypeStruct((s, d1, w), taps.dtype)) + tuple(
        jax.ShapeDtypeStruct(c.shape, c.dtype) for c in kv)
    ins = (tree.parents.astype(i32), tokens.astype(i32), posterior.astype(i32), start.astype(i32),
           active.astype(i32), taps) + tuple(kv)
    fresh = ()
    if poison:   # the fresh outputs come in as aliased inputs too, after the caches
        fresh = tuple(jnp.full(o.shape, -7 if o.dtype == i32 else jnp.nan, o.dtype) for o in outs[:5])
    aliases = {6 + i: 5 + i for i in range(layers)} | {6 + layers + i: i for i in range(len(fresh))}
    path, length, bonus, ptok, ptaps, *kv = pl.pallas_call(
        functools.partial(_kernel, layers=layers, n=n, d1=d1, dk=kv[0].shape[2], w=w,
                          interpret=interpret_mode()),
        out_shape=outs, grid=(s,), input_output_aliases=aliases,
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
        interpret=interpret_mode(), name="tree_accept")(*ins, *fresh)
    return path, length, bonus, ptok, tuple(kv), ptaps


registry.register("tree_accept", "pallas_triton")(tree_accept_pallas)
