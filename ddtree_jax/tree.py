"""DDTree on the accelerator: `build_tree` (exact best-first draft tree) and `follow_tree`.

Shapes: S streams, L draft depths, V vocabulary, B budget (non-root nodes), N = B + 1 (root = 0).

Path score of a prefix = sum over its depths of the draft log-softmax (clamped at -1e30). The tree
holds the B prefixes first in the order, shared with the golden
`ddtree_jax.reference.tree_ref.search_ref`:
    (score desc, depth asc, ancestors' scores desc from the parent up, per-depth ranks asc)
where a rank is a token's position in its depth's (logit desc, token asc) order. A parent always
precedes its children, so the set is prefix-closed and equals a heap's best-first pops.

Parallel exact form (DESIGN.md section 2): per depth, extend the previous depth's top-B prefixes by
this depth's top-K tokens (K = min(B, V)) and keep the top B; then merge the L sorted lists. With
parents and children each sorted, pair (parent slot i, rank j) can only be in a depth's top B when
(i+1)(j+1) <= B, so a depth's candidates number about B ln B rather than B*K. The merge ranks each
entry by binary search in the other depths' lists. Everything is static-shaped and jit-able.
Under a mesh the vocabulary top-K is taken per vocabulary shard and merged
(`sharding.topk_logsumexp`), so [S, L, V] never leaves its shards.

Padding nodes (index > num_nodes, only when fewer than B distinct prefixes exist): token 0,
depth 0, parent -1, score -inf; each sees only itself and nothing sees it.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax import sharding
from pallas_kernels import registry

LOGP_FLOOR = -1e30


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["tokens", "depths", "parents", "num_nodes", "visibility",
                                "node_mask", "scores"],
                   meta_fields=["max_depth"])
@dataclasses.dataclass(frozen=True)
class Tree:
    """A batch of draft trees. Node 0 is the root (the last accepted token); nodes 1..B follow.

    tokens [S, B] int32 (node i's token is tokens[:, i-1]); depths [S, B] int32 in 1..L;
    parents [S, B+1] int32 (parents[:, 0] = -1); num_nodes [S] int32 (real non-root nodes);
    visibility [S, B+1, B+1] bool (row i: i and its ancestors); node_mask [S, B+1, ceil((B+1)/32)]
    int32 (bit t%32 of word t//32 of row i = visibility[:, i, t], the attention kernel's form);
    scores [S, B] float32 path log-probs; max_depth = L (static).
    """

    tokens: jax.Array
    depths: jax.Array
    parents: jax.Array
    num_nodes: jax.Array
    visibility: jax.Array
    node_mask: jax.Array
    scores: jax.Array
    max_depth: int


def num_real_nodes(L: int, V: int, budget: int) -> int:
    """Nodes a tree of `budget` holds: min(budget, sum_d min(budget, V**d))."""
    total, n = 0, 1
    for _ in range(L):
        n = min(budget, n * V)
        total += n
    return min(budget, total)


def _check_budget(budget) -> None:
    if not isinstance(budget, (int, np.integer)) or isinstance(budget, bool) or budget < 1:
        raise ValueError(f"budget must be an int >= 1; got {budget!r}")


def _check_logits(x, name: str) -> None:
    if getattr(x, "ndim", None) != 3:
        raise ValueError(f"{name} must be [S, L, V]; got shape {getattr(x, 'shape', None)}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"{name} must be floating point; got {x.dtype}")
    if min(x.shape) < 1:
        raise ValueError(f"{name} must have S, L, V >= 1; got shape {x.shape}")
    if not isinstance(x, jax.core.Tracer) and not bool(jnp.all(jnp.isfinite(x))):
        raise ValueError(f"{name} holds non-finite values")


def build_tree(draft_logits: jax.Array, budget: int, *, topk_impl: str = "auto") -> Tree:
    """draft_logits [S, L, V] -> Tree of the `budget` best prefixes (see the module docstring).

    Non-finite logits are rejected when the array is concrete (not under a trace).
    """
    _check_budget(budget)
    _check_logits(draft_logits, "draft_logits")
    return _build(draft_logits, int(budget), registry.resolve("topk_logsumexp", topk_impl), False)


def build_tree_from_logprobs(logp: jax.Array, budget: int, *, topk_impl: str = "auto") -> Tree:
    """Like `build_tree`, but logp [S, L, V] are used as the per-depth log-probs as given."""
    _check_budget(budget)
    _check_logits(logp, "logp")
    return _build(logp, int(budget), registry.resolve("topk", topk_impl), True)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _build(x, budget: int, impl: str, given_logprobs: bool) -> Tree:
    S, L, V = x.shape
    K = min(budget, V)
    flat = x.astype(jnp.float32).reshape(S * L, V)
    if given_logprobs:
        vals, tok = registry.get("topk", impl)(flat, K)
    else:
        vals, tok, lse = sharding.topk_logsumexp(registry.get("topk_logsumexp", impl), flat, K)
        vals = vals - lse[:, None]
    logp = jnp.maximum(vals, LOGP_FLOOR).reshape(S, L, K)
    tok = tok.reshape(S, L, K)
    scores, tokens, par_slot = _per_depth_best(logp, tok, budget)
    return _assemble(scores, tokens, par_slot, budget, num_real_nodes(L, V, budget))


def _pad_to(a, n: int, value):
    return jnp.pad(a, ((0, 0), (0, n - a.shape[1])), constant_values=value)


def _per_depth_best(logp, tok, budget: int):
    """Top-`budget` prefixes of each depth, each list sorted in node order.

    Returns scores [S, L, B] (-inf past the n_d real ones), tokens [S, L, B], parent slots
    [S, L, B] (index into the previous depth's list; -1 at depth 1).
    """
    S, L, K = logp.shape
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


def _assemble(scores, tokens, par_slot, budget: int, num_nodes: int) -> Tree:
    """Merge the per-depth lists into node order and build parents, visibility and masks."""
    S, L, B = scores.shape
    N = budget + 1
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
    node_tokens = scatter(tokens, 0, jnp.int32)[:, 1:]
    depths = scatter(depth, 0, jnp.int32)[:, 1:]
    node_scores = scatter(scores, -jnp.inf, jnp.float32)[:, 1:]
    visibility = ancestors(parents, L)
    return Tree(tokens=node_tokens, depths=depths, parents=parents,
                num_nodes=jnp.full((S,), num_nodes, jnp.int32), visibility=visibility,
                node_mask=pack_bits(visibility), scores=node_scores, max_depth=L)


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


def follow_tree(tree: Tree, posterior: jax.Array):
    """Greedy walk from the root while the target's token at the current node is a child's token.

    posterior [S, B+1] int32: the target's token at each node (0 = root). Returns accepted
    [S, L+1] node indices padded with -1 (accepted[:, 0] = 0), accept_len [S] counting the root,
    bonus [S] = posterior at the last accepted node.
    """
    S, B = tree.tokens.shape
    if getattr(posterior, "ndim", None) != 2 or tuple(posterior.shape) != (S, B + 1):
        raise ValueError(f"posterior must be [S, B+1] = {(S, B + 1)}; "
                         f"got shape {getattr(posterior, 'shape', None)}")
    if not jnp.issubdtype(posterior.dtype, jnp.integer):
        raise ValueError(f"posterior must hold integer token ids; got {posterior.dtype}")
    return _follow(tree, posterior.astype(jnp.int32))


@jax.jit
def _follow(tree: Tree, posterior):
    S, B = tree.tokens.shape
    rows = jnp.arange(S)
    cur = jnp.zeros((S,), jnp.int32)
    alive = jnp.ones((S,), bool)
    steps = [cur]
    for _ in range(tree.max_depth):
        want = posterior[rows, cur]
        match = (tree.parents[:, 1:] == cur[:, None]) & (tree.tokens == want[:, None])
        alive = alive & jnp.any(match, axis=1)
        cur = jnp.where(alive, jnp.argmax(match, axis=1).astype(jnp.int32) + 1, cur)
        steps.append(jnp.where(alive, cur, -1))
    accepted = jnp.stack(steps, axis=1)
    accept_len = jnp.sum(accepted >= 0, axis=1).astype(jnp.int32)
    return accepted, accept_len, posterior[rows, cur]
