"""DDTree on the accelerator: `build_tree` (exact best-first draft tree), `build_shared_tree` (one
budget shared by all streams; `share_budget` cuts trees already built) and `follow_tree`.

Shapes: S streams, L draft depths, V vocabulary, B budget (non-root nodes), N = B + 1 (root = 0).

Path score of a prefix = sum over its depths of the draft log-softmax (clamped at -1e30). The tree
holds the B prefixes first in the order, shared with the golden
`ddtree_jax.reference.tree_ref.search_reference`:
    (score desc, depth asc, ancestors' scores desc from the parent up, per-depth ranks asc)
where a rank is a token's position in its depth's (logit desc, token asc) order. A parent always
precedes its children, so the set is prefix-closed and equals a heap's best-first pops.

Parallel exact form (docs/design.md, section 2): per depth, extend the previous depth's top-B prefixes by
this depth's top-K tokens (K = min(B, V)) and keep the top B; then merge the L sorted lists. With
parents and children each sorted, pair (parent slot i, rank j) can only be in a depth's top B when
(i+1)(j+1) <= B, so a depth's candidates number about B ln B rather than B*K. Everything is
static-shaped and jit-able: the vocabulary top-K ("topk_logsumexp" kernel operation) and the
search plus assembly ("tree_search", `pallas_kernels.tree_search`), both in the implementation
that `topk_impl` names ("auto": Pallas on a GPU, XLA elsewhere). Under a mesh the vocabulary top-K
is taken per vocabulary shard and merged (`sharding.topk_logsumexp`), so [S, L, V] never leaves
its shards.

Shared budget (`build_shared_tree(draft_logits, total, cap)`): the `total` best prefixes over all
streams, at most `cap` per stream, taken in the order
    (score desc, position in its stream's node order asc, stream asc)
over each stream's first `cap` nodes, exactly as the golden
`ddtree_jax.reference.tree_ref.shared_search_reference` pops them. Each stream's list is in node
order with non-increasing scores, so the order restricted to one stream is its node order: a stream
gets a prefix of its `build_tree(draft_logits, cap)` nodes, a prefix-closed tree of B = cap nodes.
A stream marked inactive (`active`: a finished stream) gets no node and takes nothing from the
total.

Padding nodes (index > num_nodes: fewer than B distinct prefixes exist, or the shared budget gave
the stream fewer than B): token 0, depth 0, parent -1, score -inf; each sees only itself and
nothing sees it.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax import sharding
from ddtree_jax.checks import INT32_MAX, check_int
from pallas_kernels import registry
from pallas_kernels.tree_accept.xla import walk
from pallas_kernels.topk import topk, topk_logsumexp
from pallas_kernels.tree_search import num_real_nodes, tree_search
from pallas_kernels.tree_search.xla import LOGP_FLOOR, ancestors, pack_bits

__all__ = ["LOGP_FLOOR", "Tree", "ancestors", "build_shared_tree",
           "build_shared_tree_from_logprobs", "build_tree", "build_tree_from_logprobs",
           "follow_tree", "num_real_nodes", "pack_bits", "share_budget"]


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["tokens", "depths", "parents", "num_nodes", "visibility",
                                "node_mask", "scores"],
                   meta_fields=["max_depth"])
@dataclasses.dataclass(frozen=True)
class Tree:
    """A batch of draft trees. Node 0 is the root (the last accepted token); nodes 1..B follow.

    tokens [S, B] int32 (node i's token is tokens[:, i-1]); depths [S, B] int32, 1..L for real
    nodes; parents [S, B+1] int32 (parents[:, 0] = -1); num_nodes [S] int32 (real non-root nodes;
    nodes num_nodes+1..B are padding: depth 0, parent -1, see the module docstring);
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

    topk_impl names the kernel implementation of the top-K and of the tree search. Non-finite
    logits are rejected when the array is concrete; under a trace, a stream whose logits hold NaN
    or +inf gets an empty tree (num_nodes 0, every node padding), so its step verifies no draft
    token and stays lossless.
    """
    check_int("budget", budget, 1)
    _check_logits(draft_logits, "draft_logits")
    return _build(draft_logits, int(budget), registry.resolve("topk_logsumexp", topk_impl), False)


def build_tree_from_logprobs(logp: jax.Array, budget: int, *, topk_impl: str = "auto") -> Tree:
    """Like `build_tree`, but logp [S, L, V] are used as the per-depth log-probs as given."""
    check_int("budget", budget, 1)
    _check_logits(logp, "logp")
    return _build(logp, int(budget), registry.resolve("topk", topk_impl), True)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _build(x, budget: int, impl: str, given_logprobs: bool) -> Tree:
    S, L, V = x.shape
    K = min(budget, V)
    flat = x.reshape(S * L, V)  # in its own dtype: the top-K reads bf16 logits as they are
    if given_logprobs:
        (vals, tok), lse = topk(flat, K, impl=impl), None
    else:
        vals, tok, lse = sharding.topk_logsumexp(functools.partial(topk_logsumexp, impl=impl), flat, K)
        lse = lse.reshape(S, L)
    # a row holding NaN or +inf has a non-finite logsumexp (the same pass over x, no extra read)
    vals = vals.reshape(S, L, K)
    bad = None if lse is None else ~jnp.all(jnp.isfinite(lse), axis=1)          # [S]
    if bad is not None:
        lse = jnp.where(bad[:, None], 0.0, lse)
        vals = jnp.where(bad[:, None, None], 0.0, vals)
    fields = tree_search(vals, tok.reshape(S, L, K), lse, budget, impl=impl)
    if bad is not None:   # such a stream gets an empty tree: every node padding
        fields = _keep_first(fields, jnp.where(bad, 0, fields["num_nodes"]))
    return Tree(**fields, max_depth=L)  # fields' num_nodes = num_real_nodes(L, V, budget)


def _keep_first(fields: dict, num_nodes) -> dict:
    """Tree fields with stream s cut to its first num_nodes[s] (int32 [S], at most its real count)
    nodes; the later ones become padding (token 0, depth 0, parent -1, score -inf, seen by and
    seeing only itself). A kept node's ancestors precede it, so its visibility row is unchanged."""
    n = fields["parents"].shape[1]
    eye = np.eye(n, dtype=bool)[None]                     # constants: no extra pass at run time
    eye_mask = np.zeros((1, n, -(-n // 32)), np.uint32)   # pack_bits(eye): bit i of row i
    eye_mask[0, np.arange(n), np.arange(n) // 32] = np.uint32(1) << (np.arange(n) % 32).astype(np.uint32)
    eye_mask = eye_mask.view(np.int32)
    keep = jnp.arange(n)[None, :] <= num_nodes[:, None]   # [S, B+1]: root, nodes 1..num_nodes
    rows, cube = keep[:, 1:], keep[:, :, None]
    return dict(fields, tokens=jnp.where(rows, fields["tokens"], 0),
                depths=jnp.where(rows, fields["depths"], 0),
                parents=jnp.where(keep, fields["parents"], -1),
                num_nodes=num_nodes.astype(jnp.int32),
                visibility=jnp.where(cube, fields["visibility"], eye),
                node_mask=jnp.where(cube, fields["node_mask"], eye_mask),
                scores=jnp.where(rows, fields["scores"], -jnp.inf))


def build_shared_tree(draft_logits: jax.Array, total: int, cap: int, *, active=None,
                      topk_impl: str = "auto") -> Tree:
    """draft_logits [S, L, V] -> Tree of the `total` best prefixes over all streams, at most `cap`
    per stream (order and ties: the module docstring).

    The Tree has B = cap nodes per stream; stream s holds num_nodes[s] <= cap real nodes, the first
    num_nodes[s] nodes of `build_tree(draft_logits, cap)`'s stream s, and sum(num_nodes) =
    min(total, the real nodes of those trees). total >= S * cap gives
    `build_tree(draft_logits, cap)` itself; total = 0 gives trees of padding only. total and cap
    are Python ints (static under jit); one compilation per shape and cap serves every total.
    active [S] bool (None: every stream): a stream where it is False (a finished one) gets an empty
    tree and takes nothing from `total`.
    topk_impl and non-finite logits as in `build_tree`: a stream whose logits hold NaN or +inf under
    a trace gets an empty tree and takes nothing from `total`.
    """
    check_int("total", total, 0)
    check_int("cap", cap, 1)
    _check_logits(draft_logits, "draft_logits")
    return _build_shared(draft_logits, jnp.int32(min(total, INT32_MAX)), _active(active, draft_logits),
                         int(cap), registry.resolve("topk_logsumexp", topk_impl), False)


def build_shared_tree_from_logprobs(logp: jax.Array, total: int, cap: int, *, active=None,
                                    topk_impl: str = "auto") -> Tree:
    """Like `build_shared_tree`, but logp [S, L, V] are used as the per-depth log-probs as given."""
    check_int("total", total, 0)
    check_int("cap", cap, 1)
    _check_logits(logp, "logp")
    return _build_shared(logp, jnp.int32(min(total, INT32_MAX)), _active(active, logp), int(cap),
                         registry.resolve("topk", topk_impl), True)


def share_budget(tree: Tree, total, *, active=None) -> Tree:
    """Per-stream trees of B = cap nodes (`build_tree(draft_logits, cap)`) -> their shared-budget
    cut, the `build_shared_tree(draft_logits, total, cap, active=active)` Tree: each stream keeps
    its first num_nodes[s] nodes, `total` over the active streams in the module docstring's order.

    total: an int >= 0, or an integer scalar array (traced under jit: one compilation serves every
    total; `ddtree_jax.budget.shared_total` picks one per step); active [S] bool or None.
    """
    if not isinstance(tree, Tree):
        raise ValueError(f"tree must be a Tree; got {type(tree).__name__}")
    if getattr(total, "ndim", None) == 0 and jnp.issubdtype(total.dtype, jnp.integer):
        total = jnp.asarray(total, jnp.int32)
    else:
        check_int("total", total, 0)
        total = jnp.int32(min(total, INT32_MAX))
    return _share(tree, total, _active(active, tree.tokens))


def _active(active, x) -> jax.Array:
    """active [S] bool or None (every stream; S = x.shape[0]) -> bool [S], or ValueError naming
    `active`."""
    if active is None:
        return jnp.ones(x.shape[:1], bool)
    if getattr(active, "shape", None) != x.shape[:1] or getattr(active, "dtype", None) != jnp.bool_:
        raise ValueError(f"active must be bool [S={x.shape[0]}]; got {getattr(active, 'dtype', None)} "
                         f"{getattr(active, 'shape', None)}")
    return jnp.asarray(active)


@functools.partial(jax.jit, static_argnums=(3, 4, 5))
def _build_shared(x, total, active, cap: int, impl: str, given_logprobs: bool) -> Tree:
    # total is an operand, not static: one compilation per shape and cap serves every total
    return _share(_build(x, cap, impl, given_logprobs), total, active)


def _share(tree: Tree, total, active) -> Tree:
    """`share_budget` of checked arguments: total int32 [], active bool [S]."""
    fields = {f.name: getattr(tree, f.name)
              for f in dataclasses.fields(Tree) if f.name != "max_depth"}
    counts = _shared_counts(tree.scores, jnp.where(active, tree.num_nodes, 0), total)
    return Tree(**_keep_first(fields, counts), max_depth=tree.max_depth)


def _shared_counts(scores: jax.Array, num_nodes: jax.Array, total) -> jax.Array:
    """How many nodes each stream gets when `total` nodes are taken over all streams.

    scores [S, B] float32: each stream's nodes in node order (non-increasing over its real nodes);
    num_nodes [S]: node p of stream s is real when p < num_nodes[s]; total: int scalar >= 0. The
    `total` real nodes first in the order (score desc, p asc, s asc) are taken; returns int32 [S],
    their count per stream (a prefix of each stream's nodes).
    """
    S, B = scores.shape
    real = (jnp.arange(B)[None, :] < num_nodes[:, None]).T.reshape(B * S)
    # flat index p * S + s ascends with (p, s); a stable ascending sort of -score keeps that order
    # among equal scores (0.0 and -0.0 alike); padding sorts last
    flat = scores.T.reshape(B * S)
    key = jnp.where(real, jnp.where(flat == 0, 0.0, -flat), jnp.inf)
    order = jnp.argsort(key, stable=True)
    taken = jnp.zeros((B * S,), bool).at[order].set(jnp.arange(B * S) < total) & real
    return jnp.sum(taken.reshape(B, S), axis=0, dtype=jnp.int32)


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
    return walk(tree, posterior.astype(jnp.int32))
