"""The "xla" implementation of "tree_search": per-depth jax.lax.top_k, then a searchsorted merge.

    search(vals [S, L, K], tok [S, L, K], lse [S, L] | None, budget) -> (scores, tokens, slots)
        each [S, L, B]: every depth's top-B prefixes in node order (-inf / 0 / -1 past the real
        ones); slots index the previous depth's list (-1 at depth 1).
    assemble(scores, tokens, slots, num_nodes) -> the tree fields (`pallas_kernels.tree_search`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

LOGP_FLOOR = -1e30


def _pad_to(a, n: int, value):
    return jnp.pad(a, ((0, 0), (0, n - a.shape[1])), constant_values=value)


def search(vals, tok, lse, budget: int):
    """Top-`budget` prefixes of each depth, each list sorted in node order."""
    S, L, K = vals.shape
    logp = jnp.maximum(vals if lse is None else vals - lse[..., None], LOGP_FLOOR)
    sc = _pad_to(logp[:, 0], budget, -jnp.inf)
    scores, tokens, slots = [sc], [_pad_to(tok[:, 0], budget, 0)], [jnp.full((S, budget), -1)]
    n_prev = K
    for d in range(1, L):
        n = min(budget, n_prev * K)
        # Row-major (parent slot, rank) pairs that can reach the top `budget`: index order = ties.
        pi, pj = np.nonzero((np.arange(n_prev)[:, None] + 1) * (np.arange(K)[None, :] + 1)
                            <= budget)
        cand = sc[:, pi] + logp[:, d, pj]
        sc, best = jax.lax.top_k(cand, n)
        sc = _pad_to(sc, budget, -jnp.inf)
        scores.append(sc)
        tokens.append(_pad_to(tok[:, d, pj][jnp.arange(S)[:, None], best], budget, 0))
        slots.append(_pad_to(jnp.asarray(pi, jnp.int32)[best], budget, -1))
        n_prev = n
    return jnp.stack(scores, 1), jnp.stack(tokens, 1), jnp.stack(slots, 1)


def assemble(scores, tokens, par_slot, num_nodes: int) -> dict:
    """Merge the per-depth lists into node order and build parents, visibility and masks."""
    S, L, B = scores.shape
    N = B + 1
    # Position of each entry in the merged order: its slot, plus the entries of earlier depths
    # scoring >= it, plus those of later depths scoring > it. Padding (-inf) counts nowhere.
    neg = -scores  # ascending per depth
    def count(side):  # [s, d', d, j]: entries of depth d' scoring >= (right) or > (left) x[d, j]
        ss = functools.partial(jnp.searchsorted, side=side, method="scan_unrolled")
        return jax.vmap(jax.vmap(ss, (0, None)))(neg, neg.reshape(S, L * B)).reshape(S, L, L, B)

    ge, gt = count("right"), count("left")
    earlier = np.arange(L)[:, None] < np.arange(L)[None, :]  # [d', d]
    later = np.arange(L)[:, None] > np.arange(L)[None, :]
    rank = (jnp.arange(B)[None, None, :]
            + jnp.sum(jnp.where(earlier[None, :, :, None], ge, 0), 1)
            + jnp.sum(jnp.where(later[None, :, :, None], gt, 0), 1))
    rank = jnp.where(jnp.isfinite(scores) & (rank < num_nodes), rank, N)  # N: dropped
    node = rank + 1  # node index of each entry (N + 1 when not in the tree)
    parent = jnp.concatenate(
        [jnp.zeros((S, 1, B), jnp.int32),
         jnp.take_along_axis(node[:, :-1], jnp.maximum(par_slot[:, 1:], 0), axis=2)], axis=1)
    depth = jnp.broadcast_to(jnp.arange(1, L + 1, dtype=jnp.int32)[None, :, None], (S, L, B))

    def scatter(vals, fill, dtype):
        out = jnp.full((S, N), fill, dtype)
        return out.at[jnp.arange(S)[:, None], node.reshape(S, L * B)].set(
            vals.reshape(S, L * B).astype(dtype), mode="drop")

    parents = scatter(parent, -1, jnp.int32)
    visibility = ancestors(parents, L)
    return dict(tokens=scatter(tokens, 0, jnp.int32)[:, 1:],
                depths=scatter(depth, 0, jnp.int32)[:, 1:],
                parents=parents, visibility=visibility, node_mask=pack_bits(visibility),
                scores=scatter(scores, -jnp.inf, jnp.float32)[:, 1:],
                num_nodes=jnp.full((S,), num_nodes, jnp.int32))


def ancestors(parents, max_depth: int):
    """parents [S, N] (-1 = none) -> bool [S, N, N]: row i marks i and its ancestors."""
    S, N = parents.shape
    hop = jnp.arange(N, dtype=jnp.int32)[None, :].repeat(S, 0)
    cols = jnp.arange(N, dtype=jnp.int32)
    vis = hop[:, :, None] == cols
    for _ in range(max_depth):
        hop = jnp.where(hop >= 0, jnp.take_along_axis(parents, jnp.maximum(hop, 0), 1), -1)
        vis = vis | (hop[:, :, None] == cols)
    return vis


def pack_bits(vis):
    """bool [S, N, N] -> int32 [S, N, ceil(N/32)]: bit t%32 of word t//32 of row i = vis[:, i, t]."""
    S, N, _ = vis.shape
    W = -(-N // 32)
    v = jnp.pad(vis, ((0, 0), (0, 0), (0, W * 32 - N))).reshape(S, N, W, 32).astype(jnp.uint32)
    words = jnp.sum(v << jnp.arange(32, dtype=jnp.uint32), axis=-1, dtype=jnp.uint32)
    return jax.lax.bitcast_convert_type(words, jnp.int32)
