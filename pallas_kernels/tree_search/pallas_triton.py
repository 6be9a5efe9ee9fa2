"""The "pallas_triton" implementation of "tree_search": two kernels, search and assemble.

search (grid S, one program per stream) walks the depths in one loop. Depth d's list holds the
best prefixes of depth d in node order, as in the "xla" implementation, and R holds the best B of
all depths so far in node order (ties: earlier depth first). A depth-(d+1) prefix scoring <= R's
B-th score theta can never enter the tree (B entries of earlier depths precede it), so each depth
keeps only candidates scoring > theta: a prefix of the list the "xla" implementation keeps, hence
the same slots and ties. The loop stops at the first empty depth. Per depth:
  candidates: static (parent slot i, child rank j) pairs with (i+1)(j+1) <= B, row-major (the tie
              order), masked to i < the previous list's length; score = parent score + logp[j].
  select:     those > theta, cut to the first <= Bc (B rounded up to a power of two) in (score
              desc, pair asc) order by `superset` when more, compacted through scratch.
  rank:       pairwise counts over column tiles of the compacted list give each one's rank (the
              first B form depth d's list) and, against R, both sides' positions in the merge.
  merge:      R's entries and depth d's move to their merged positions < B (double-buffered R).
Outputs: R's scores and ids (depth * Bc + slot), each list's child ranks and parent slots, and
node_of [S, L, Bc] (node index of each listed prefix that is in the tree).

assemble (grid S x row blocks): per node row, token, depth, score, the ancestor chain through the
parent slots (parents, node_mask bits; as many steps as the block's deepest node), then
visibility from the row's own node_mask words.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.pallas_compat import interpret_mode, pl, plgpu
from pallas_kernels.selection import (at, barrier, exclusive_cumsum, in_superset, keys, pow2_at_least,
                                      superset)
from pallas_kernels.tree_search.xla import LOGP_FLOOR

# Warps of the search kernel (read when traced); 0: by the candidate pairs, 4 (budget <= 64) to 16
# (budget >= 256). Timings: docs/kernels/tree_search.md.
SEARCH_WARPS = 0
# Columns of the search's pairwise comparison tiles [Bc, SEARCH_COLS] (read when traced); 16 keeps
# the kernel free of register spills on sm_90a (docs/kernels/tree_search.md).
SEARCH_COLS = 16
ASSEMBLE_ENTRIES = 16384  # visibility entries (rows x columns) per assemble program


def candidates(budget: int, K: int):
    """(parent slot, child rank) int32 [Cp] each: the pairs with (i+1)(j+1) <= B, i < B, j < K in
    row-major order, padded to a power of two with parent slot B (never a real slot)."""
    pi, pj = np.nonzero((np.arange(budget)[:, None] + 1) * (np.arange(K)[None, :] + 1) <= budget)
    ci = np.full(pow2_at_least(len(pi)), budget, np.int32)
    cj = np.zeros(len(ci), np.int32)
    ci[:len(pi)], cj[:len(pj)] = pi, pj
    return ci, cj


def _search_kernel(vals_ref, *refs, L: int, K: int, B: int, has_lse: bool, cols: int,
                   interpret: bool):
    if has_lse:
        lse_ref, *refs = refs
    (ci_ref, cj_ref, osc_ref, oid_ref, lrank_ref, lpar_ref, node_ref,  # outputs, then scratch:
     lsc_ref, csc_ref, cpi_ref, cpj_ref, cnt_ref, rsc_ref, rid_ref) = refs
    s = pl.program_id(0)
    Bc = lsc_ref.shape[2]
    tile = min(Bc, cols)
    e = jnp.arange(Bc)
    r_ok = e < B

    def logp(d, j, ok):
        v = plgpu.load(vals_ref.at[s * L + d, j], mask=ok, other=0.0)
        if has_lse:
            v = v - plgpu.load(lse_ref.at[s * L + d])
        return jnp.maximum(v, LOGP_FLOOR)

    # Depth 1: the top-K log-probs; R = that list.
    k_ok = e < K
    q0 = logp(0, e, k_ok)
    plgpu.store(lsc_ref.at[s, 0, at(e, k_ok)], q0, mask=k_ok)
    plgpu.store(lpar_ref.at[s, 0, at(e, k_ok)], jnp.full((Bc,), -1, jnp.int32), mask=k_ok)
    plgpu.store(lrank_ref.at[s, 0, at(e, k_ok)], e, mask=k_ok)
    r0 = jnp.where(k_ok, q0, -jnp.inf)
    plgpu.store(rsc_ref.at[s, 0, at(e, r_ok)], r0, mask=r_ok)
    plgpu.store(rid_ref.at[s, 0, at(e, r_ok)], jnp.where(k_ok, e, -1), mask=r_ok)
    theta = jnp.max(jnp.where(e == B - 1, r0, -jnp.inf))
    barrier(interpret)

    q = jnp.arange(ci_ref.shape[0])
    ci, cj = plgpu.load(ci_ref.at[q]), plgpu.load(cj_ref.at[q])

    def depth(c):
        d, n_prev, theta, par = c
        cval = ci < n_prev
        sc = plgpu.load(lsc_ref.at[s, d - 1, ci], mask=cval, other=0.0) + logp(d, cj, cval)
        keep = cval & (sc > theta)
        skey = keys(sc)
        lo, cut, n = superset(skey, keep, q, B, Bc)
        sel = in_superset(skey, keep, q, lo, cut)
        dst = at(exclusive_cumsum(sel), sel)
        plgpu.store(csc_ref.at[s, dst], sc, mask=sel)
        plgpu.store(cpi_ref.at[s, dst], ci, mask=sel)
        plgpu.store(cpj_ref.at[s, dst], cj, mask=sel)
        barrier(interpret)
        ok = e < n
        v = plgpu.load(csc_ref.at[s, e], mask=ok, other=0.0)
        pi = plgpu.load(cpi_ref.at[s, e], mask=ok, other=0)
        pj = plgpu.load(cpj_ref.at[s, e], mask=ok, other=0)
        rv = plgpu.load(rsc_ref.at[s, par, e], mask=r_ok, other=-jnp.inf)
        ri = plgpu.load(rid_ref.at[s, par, e], mask=r_ok, other=-1)

        def count(t, acc):  # one column tile of the compacted list
            rank, below = acc
            f = t * tile + jnp.arange(tile)
            fok = f < n
            fv = plgpu.load(csc_ref.at[s, f], mask=fok, other=0.0)
            before = jnp.where(f[None, :] < e[:, None], fv[None, :] >= v[:, None],
                               fv[None, :] > v[:, None])
            rank = rank + jnp.sum(jnp.where(before & fok[None, :], 1, 0), axis=1)
            over = jnp.where((fv[None, :] > rv[:, None]) & fok[None, :] & r_ok[:, None], 1, 0)
            plgpu.store(cnt_ref.at[s, at(f, fok)], jnp.sum(over, axis=0), mask=fok)
            return rank, below + jnp.sum(over, axis=1)

        zero = jnp.zeros((Bc,), jnp.int32)
        rank, below = jax.lax.fori_loop(0, (n + tile - 1) // tile, count, (zero, zero))
        barrier(interpret)
        kept = ok & (rank < B)
        dst = at(rank, kept)
        plgpu.store(lsc_ref.at[s, d, dst], v, mask=kept)
        plgpu.store(lpar_ref.at[s, d, dst], pi, mask=kept)
        plgpu.store(lrank_ref.at[s, d, dst], pj, mask=kept)
        # Merge: a list entry goes after the R entries scoring >= it (B minus those below it).
        pos_new = rank + B - plgpu.load(cnt_ref.at[s, e], mask=ok, other=0)
        new = kept & (pos_new < B)
        plgpu.store(rsc_ref.at[s, 1 - par, at(pos_new, new)], v, mask=new)
        plgpu.store(rid_ref.at[s, 1 - par, at(pos_new, new)], d * Bc + rank, mask=new)
        pos_old = e + below
        old = r_ok & (pos_old < B)
        plgpu.store(rsc_ref.at[s, 1 - par, at(pos_old, old)], rv, mask=old)
        plgpu.store(rid_ref.at[s, 1 - par, at(pos_old, old)], ri, mask=old)
        theta = jnp.max(jnp.maximum(jnp.where(new & (pos_new == B - 1), v, -jnp.inf),
                                    jnp.where(old & (pos_old == B - 1), rv, -jnp.inf)))
        barrier(interpret)
        return d + 1, jnp.minimum(n, B), theta, 1 - par

    start = (jnp.int32(1), jnp.int32(K), theta, jnp.int32(0))
    _, _, _, par = jax.lax.while_loop(lambda c: (c[0] < L) & (c[1] > 0), depth, start)
    sc = plgpu.load(rsc_ref.at[s, par, e], mask=r_ok, other=-jnp.inf)
    ids = plgpu.load(rid_ref.at[s, par, e], mask=r_ok, other=-1)
    plgpu.store(osc_ref.at[s, at(e, r_ok)], sc, mask=r_ok)
    plgpu.store(oid_ref.at[s, at(e, r_ok)], ids, mask=r_ok)
    real = r_ok & (ids >= 0)
    shift = Bc.bit_length() - 1
    plgpu.store(node_ref.at[s, at(ids >> shift, real), ids & (Bc - 1)], e + 1, mask=real)


@functools.partial(jax.jit, static_argnames=("budget",))
def search(vals, tok, lse, budget: int):
    """vals, tok [S, L, K], lse [S, L] or None -> (scores [S, B] f32 and ids [S, B] int32 in node
    order (id = depth index * Bc + slot, -1 past the real nodes), list child ranks [S, L, Bc],
    list parent slots [S, L, Bc], node_of [S, L, Bc], tok [S*L, K]); list entries outside the
    tree are unspecified."""
    S, L, K = vals.shape
    B, Bc = budget, pow2_at_least(budget)
    ci, cj = candidates(B, K)
    interpret = interpret_mode()
    lse_args = () if lse is None else (lse.reshape(S * L).astype(jnp.float32),)
    f32, i32 = jnp.float32, jnp.int32
    shapes = [((S, B), f32), ((S, B), i32)] + [((S, L, Bc), i32)] * 3 + [((S, L, Bc), f32)] \
        + [((S, Bc), f32)] + [((S, Bc), i32)] * 3 + [((S, 2, Bc), f32), ((S, 2, Bc), i32)]
    out = pl.pallas_call(
        functools.partial(_search_kernel, L=L, K=K, B=B, has_lse=lse is not None,
                          cols=SEARCH_COLS, interpret=interpret),
        out_shape=tuple(jax.ShapeDtypeStruct(s, d) for s, d in shapes),
        grid=(S,), interpret=interpret,
        compiler_params=plgpu.CompilerParams(
            num_warps=SEARCH_WARPS or min(16, max(4, len(ci) // 128)), num_stages=1),
    )(vals.astype(f32).reshape(S * L, K), *lse_args, jnp.asarray(ci), jnp.asarray(cj))
    return (*out[:5], tok.astype(i32).reshape(S * L, K))


def _assemble_kernel(osc_ref, oid_ref, lrank_ref, lpar_ref, node_ref, ktok_ref, tok_ref, dep_ref,
                     par_ref, vis_ref, mask_ref, sc_ref, nn_ref, *, rows: int, num_nodes: int,
                     interpret: bool):
    s, t = pl.program_id(0), pl.program_id(1)
    plgpu.store(nn_ref.at[pl.ds(s, 1)], jnp.full((1,), num_nodes, jnp.int32),
                mask=jnp.full((1,), t == 0))  # row block 0 writes the stream's num_nodes
    _, L, Bc = lrank_ref.shape
    B = tok_ref.shape[1]
    N, W = B + 1, mask_ref.shape[2]
    i = t * rows + jnp.arange(rows)  # node index
    i_ok = i < N
    real = i_ok & (i >= 1)
    p = at(i - 1, real)  # index into the [S, B] fields
    ids = plgpu.load(oid_ref.at[s, p], mask=real, other=-1)
    valid = ids >= 0
    d, slot = ids >> (Bc.bit_length() - 1), ids & (Bc - 1)
    j = plgpu.load(lrank_ref.at[s, d, slot], mask=valid, other=0)
    token = plgpu.load(ktok_ref.at[s * L + d, j], mask=valid, other=0)
    plgpu.store(tok_ref.at[s, p], jnp.where(valid, token, 0), mask=real)
    plgpu.store(dep_ref.at[s, p], jnp.where(valid, d + 1, 0), mask=real)
    plgpu.store(sc_ref.at[s, p], plgpu.load(osc_ref.at[s, p], mask=real, other=0.0), mask=real)
    w = jnp.arange(pow2_at_least(W))

    def bit(node, ok):  # [rows, words]: node's bit in its word
        return jnp.where(ok[:, None] & (w[None, :] == (node >> 5)[:, None]),
                         jnp.left_shift(1, node & 31)[:, None], 0)

    # The root's bit in every tree row (and the root's own); a padding row sees only itself.
    words = bit(jnp.where(valid | (i == 0), 0, i), i_ok)

    def up(c):  # one step up every row's chain: self, parent, ..., the depth-1 ancestor
        step, d, slot, alive, words, parent = c
        node = plgpu.load(node_ref.at[s, d, slot], mask=alive, other=0)
        words = words + bit(node, alive)  # distinct bits: + is |
        parent = jnp.where(alive & (step == 1), node, parent)
        slot = plgpu.load(lpar_ref.at[s, d, slot], mask=alive, other=0)
        return step + 1, d - 1, slot, alive & (d >= 1), words, parent

    # Stops when every row of the block has reached depth 1: the tree's depth, not L, round trips.
    start = (jnp.int32(0), d, slot, valid, words, jnp.where(valid, 0, -1))
    *_, words, parent = jax.lax.while_loop(lambda c: jnp.max(c[3].astype(jnp.int32)) > 0, up,
                                           start)
    row = at(i, i_ok)
    plgpu.store(par_ref.at[s, row], parent, mask=i_ok)
    w_ok = i_ok[:, None] & (w < W)[None, :]
    plgpu.store(mask_ref.at[s, row[:, None], at(w, w < W)[None, :]], words, mask=w_ok)
    barrier(interpret)
    col = jnp.arange(pow2_at_least(N))
    v_ok = i_ok[:, None] & (col < N)[None, :]
    wv = plgpu.load(mask_ref.at[s, row[:, None], (col >> 5)[None, :]], mask=v_ok, other=0)
    plgpu.store(vis_ref.at[s, row[:, None], at(col, col < N)[None, :]],
                ((wv >> (col & 31)[None, :]) & 1) == 1, mask=v_ok)


def _poisoned(dtype, shape):
    """An output buffer no kernel result can match: NaN, INT_MIN, or True for bool."""
    if dtype == jnp.bool_:
        return jnp.ones(shape, dtype)
    return jnp.full(shape, jnp.nan if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min, dtype)


@functools.partial(jax.jit, static_argnames=("num_nodes", "poison"))
def assemble(scores, ids, list_ranks, list_parents, node_of, tok, *, num_nodes: int,
             poison: bool = False) -> dict:
    """`search`'s outputs -> the tree fields (see `pallas_kernels.tree_search`), num_nodes [S]
    (the static count of real nodes) among them. poison=True hands the kernel output buffers
    (aliased) that no written value can match, so unwritten elements show (tests)."""
    S, B = scores.shape
    N = B + 1
    i32 = jnp.int32
    shapes = [((S, B), i32), ((S, B), i32), ((S, N), i32), ((S, N, N), jnp.bool_),
              ((S, N, -(-N // 32)), i32), ((S, B), jnp.float32), ((S,), i32)]
    interpret = interpret_mode()
    rows = max(1, min(32, ASSEMBLE_ENTRIES // pow2_at_least(N)))
    kernel = functools.partial(_assemble_kernel, rows=rows, num_nodes=num_nodes, interpret=interpret)
    ins = [scores, ids, list_ranks, list_parents, node_of, tok]
    if poison:      # the poisoned buffers arrive after the inputs; the kernel writes their aliases
        ins += [_poisoned(d, s) for s, d in shapes]
        kernel = functools.partial(lambda k, *refs: k(*refs[:6], *refs[6 + len(shapes):]), kernel)
    out = pl.pallas_call(
        kernel, out_shape=tuple(jax.ShapeDtypeStruct(s, d) for s, d in shapes),
        input_output_aliases={6 + i: i for i in range(len(shapes))} if poison else {},
        grid=(S, -(-N // rows)), interpret=interpret,
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1),
    )(*ins)
    return dict(zip(("tokens", "depths", "parents", "visibility", "node_mask", "scores",
                     "num_nodes"), out))
