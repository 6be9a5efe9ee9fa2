"""Numpy goldens for DDTree: a literal heap-based best-first `build_tree`, its shared-budget
sibling `build_shared_tree` (a heap over all streams' prefixes), and `follow_tree`.

Written from the math (docs/design.md, section 2), in float64, without calling the JAX code.

Node order (shared with `ddtree_jax.tree`, so ties are broken identically): a depth-d prefix with
per-depth ranks r_1..r_d (rank = position in that depth's (log-prob desc, token asc) order) and
prefix scores s_1..s_d (s_d = its path log-prob) sorts by the key
    (-s_d, d, -s_{d-1}, ..., -s_1, r_1, ..., r_d).
A parent always precedes its children (a child's score <= its parent's; equal scores fall to the
depth), and a sibling of lower rank precedes one of higher rank, so popping a heap seeded with the
root's first child, pushing each popped node's next sibling and first child, yields prefixes in
exactly this order.
"""

from __future__ import annotations

import heapq
import itertools

import numpy as np

LOGP_FLOOR = -1e30  # log-probs are clamped here so every real prefix has a finite score


def log_softmax_reference(x) -> np.ndarray:
    """float64 log-softmax over the last axis, clamped at LOGP_FLOOR."""
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    lse = m + np.log(np.exp(x - m).sum(-1, keepdims=True))
    return np.maximum(x - lse, LOGP_FLOOR)


def _best_first(logp, K: int):
    """One stream's prefixes in node order, lazily. logp [L, V] float64; only each depth's K best
    tokens extend a prefix (K >= the number of nodes wanted suffices: a sibling of lower rank
    precedes every node). Yields (token, depth, parent node index (0 = root), score); node i is the
    i-th yield."""
    L = logp.shape[0]
    order = [np.argsort(-logp[d], kind="stable")[:K] for d in range(L)]
    node_of = {(): 0}  # rank path -> node index
    score_of = {(): 0.0}
    heap = []

    def push(path):
        d = len(path)
        sc = score_of[path[:-1]] + logp[d - 1, order[d - 1][path[-1]]]
        anc = tuple(-score_of[path[:i]] for i in range(d - 1, 0, -1))
        heapq.heappush(heap, ((-sc, d) + anc + path, path, sc))

    push((0,))
    n = 0
    while heap:
        _, path, sc = heapq.heappop(heap)
        n += 1
        d = len(path)
        node_of[path], score_of[path] = n, sc
        yield int(order[d - 1][path[-1]]), d, node_of[path[:-1]], sc
        if path[-1] + 1 < len(order[d - 1]):
            push(path[:-1] + (path[-1] + 1,))
        if d < L:
            push(path + (0,))


def _empty_tree(S: int, budget: int) -> dict:
    """Tree fields of S streams of `budget` padding nodes each, num_nodes 0."""
    return dict(tokens=np.zeros((S, budget), np.int32), depths=np.zeros((S, budget), np.int32),
                scores=np.full((S, budget), -np.inf), parents=np.full((S, budget + 1), -1, np.int32),
                num_nodes=np.zeros(S, np.int32))


def _put(out: dict, s: int, node) -> None:
    """Append `node` = (token, depth, parent, score) to stream s of `out` as its next node."""
    n = out["num_nodes"][s] = out["num_nodes"][s] + 1
    token, depth, parent, score = node
    out["tokens"][s, n - 1], out["depths"][s, n - 1], out["scores"][s, n - 1] = token, depth, score
    out["parents"][s, n] = parent


def _with_visibility(out: dict) -> dict:
    """`out` with visibility and node_mask added from its parents."""
    out["visibility"] = visibility_reference(out["parents"])
    out["node_mask"] = pack_bits_reference(out["visibility"])
    return out


def search_reference(logp, budget: int) -> dict:
    """Best-first DDTree search on per-depth log-probs logp [S, L, V] (any real values).

    Returns numpy arrays: tokens, depths, scores [S, budget]; parents [S, budget+1]; num_nodes [S];
    visibility [S, budget+1, budget+1]; node_mask [S, budget+1, ceil((budget+1)/32)] int32.
    Padding nodes (index > num_nodes): token 0, depth 0, parent -1, score -inf, visible only to
    themselves.
    """
    logp = np.asarray(logp, np.float64)
    S, L, V = logp.shape
    out = _empty_tree(S, budget)
    for s in range(S):
        for node in itertools.islice(_best_first(logp[s], min(budget, V)), budget):
            _put(out, s, node)
    return _with_visibility(out)


def shared_search_reference(logp, total: int, cap: int, empty=None) -> dict:
    """The `total` best prefixes over all streams of logp [S, L, V], at most `cap` per stream.

    A best-first search over the union of the streams' prefix lattices: a heap holds, for every
    stream below its cap with prefixes left, its best prefix not yet taken (its next node in its own
    node order, the order of `search_reference`), keyed by
        (score desc, the prefix's position in its stream's node order asc, stream asc);
    each pop takes that prefix into its stream's tree, until `total` are taken or the heap is empty.
    A prefix's parent is in the same stream, earlier and scoring at least as much, so it is always
    taken first. Streams where empty [S] (bool) holds get no prefix and take nothing from `total`.
    Returns `search_reference`'s fields at budget `cap`, each stream's nodes in its node order.
    """
    logp = np.asarray(logp, np.float64)
    S, L, V = logp.shape
    empty = np.zeros(S, bool) if empty is None else np.asarray(empty, bool)
    out = _empty_tree(S, cap)
    streams = [_best_first(logp[s], min(cap, V)) for s in range(S)]
    heap = []

    def push(s, pos):  # stream s's node at position pos (0-based) of its node order, if any
        if pos < cap and (node := next(streams[s], None)) is not None:
            heapq.heappush(heap, (-node[3], pos, s, node))

    for s in np.flatnonzero(~empty):
        push(int(s), 0)
    for _ in range(total):
        if not heap:
            break
        _, pos, s, node = heapq.heappop(heap)
        _put(out, s, node)
        push(s, pos + 1)
    return _with_visibility(out)


def build_tree_reference(draft_logits, budget: int) -> dict:
    """draft_logits [S, L, V] -> the DDTree of `search_reference` on their float64 log-softmax."""
    return search_reference(log_softmax_reference(draft_logits), budget)


def build_shared_tree_reference(draft_logits, total: int, cap: int, active=None) -> dict:
    """draft_logits [S, L, V] -> `shared_search_reference` on their float64 log-softmax. A stream
    with a depth whose logits hold NaN or +inf, or are all -inf (no distribution), is empty, and so
    is a stream where active [S] (bool; None: all) is False."""
    x = np.asarray(draft_logits, np.float64)
    rows_ok = ~np.isnan(x).any(-1) & ~np.isposinf(x).any(-1) & (x > -np.inf).any(-1)   # [S, L]
    empty = ~rows_ok.all(-1)
    logp = log_softmax_reference(np.where(empty[:, None, None], 0.0, x))
    if active is not None:
        empty = empty | ~np.asarray(active, bool)
    return shared_search_reference(logp, total, cap, empty)


def shared_total_reference(logp, cap: int, active, totals, seconds) -> tuple[int, np.ndarray]:
    """The shared budget of the best expected rate (`ddtree_jax.budget`), by enumeration.

    logp [S, L, V] per-depth log-probs, active [S] bool; (totals, seconds): the step-time curve,
    linear between its points and constant outside them. For every N from 0 to the active streams'
    prefixes (at most cap each) or the largest measured total, whichever is smaller: the tree of
    `shared_search_reference(logp, N, cap)` over the active streams, its expected emitted tokens
    E(N) = (active streams) + sum of exp(score) over its nodes, and rate(N) = E(N) / t(N).
    -> (the N of the highest rate, the smallest on ties; rate [N_max + 1]).
    """
    active = np.asarray(active, bool)
    available = int(shared_search_reference(logp, logp.shape[0] * cap, cap, ~active)["num_nodes"].sum())
    order = np.argsort(totals)
    totals, seconds = np.asarray(totals, np.float64)[order], np.asarray(seconds, np.float64)[order]
    rate = []
    for n in range(min(available, int(totals[-1])) + 1):
        scores = shared_search_reference(logp, n, cap, ~active)["scores"]
        expected = active.sum() + np.exp(scores[np.isfinite(scores)]).sum()
        rate.append(expected / np.interp(n, totals, seconds))
    rate = np.asarray(rate)
    return int(np.argmax(rate)), rate


def visibility_reference(parents) -> np.ndarray:
    """parents [S, N] (-1 = none) -> bool [S, N, N]: row i marks i and its ancestors."""
    S, N = parents.shape
    vis = np.zeros((S, N, N), bool)
    for s in range(S):
        for i in range(N):
            j = i
            while j >= 0:
                vis[s, i, j] = True
                j = parents[s, j]
    return vis


def pack_bits_reference(vis) -> np.ndarray:
    """bool [S, N, N] -> int32 [S, N, ceil(N/32)]: bit t%32 of word t//32 of row i = vis[.., i, t]."""
    S, N, _ = vis.shape
    W = -(-N // 32)
    words = np.zeros((S, N, W), np.uint32)
    for t in range(N):
        words[:, :, t // 32] |= vis[:, :, t].astype(np.uint32) << np.uint32(t % 32)
    return words.view(np.int32)


def follow_tree_reference(tokens, parents, posterior, max_depth: int):
    """Walk from the root while the target's token at the current node is a child's token.

    tokens [S, B], parents [S, B+1], posterior [S, B+1] ->
    (accepted [S, max_depth+1] padded with -1, accept_len [S] counting the root, bonus [S]).
    """
    S, B = tokens.shape
    accepted = np.full((S, max_depth + 1), -1, np.int32)
    accept_len = np.zeros(S, np.int32)
    bonus = np.zeros(S, np.int32)
    for s in range(S):
        cur, path = 0, [0]
        while True:
            nxt = [i for i in range(1, B + 1)
                   if parents[s, i] == cur and tokens[s, i - 1] == posterior[s, cur]]
            if not nxt:
                break
            cur = nxt[0]
            path.append(cur)
        accepted[s, :len(path)] = path
        accept_len[s] = len(path)
        bonus[s] = posterior[s, cur]
    return accepted, accept_len, bonus
