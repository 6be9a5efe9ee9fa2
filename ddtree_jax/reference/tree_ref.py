"""Numpy goldens for DDTree: a literal heap-based best-first `build_tree`, and `follow_tree`.

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

import numpy as np

LOGP_FLOOR = -1e30  # log-probs are clamped here so every real prefix has a finite score


def log_softmax_reference(x) -> np.ndarray:
    """float64 log-softmax over the last axis, clamped at LOGP_FLOOR."""
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    lse = m + np.log(np.exp(x - m).sum(-1, keepdims=True))
    return np.maximum(x - lse, LOGP_FLOOR)


def search_reference(logp, budget: int) -> dict:
    """Best-first DDTree search on per-depth log-probs logp [S, L, V] (any real values).

    Returns numpy arrays: tokens, depths, scores [S, budget]; parents [S, budget+1]; num_nodes [S];
    visibility [S, budget+1, budget+1]; node_mask [S, budget+1, ceil((budget+1)/32)] int32.
    Padding nodes (index > num_nodes): token 0, depth 0, parent -1, score -inf, visible only to
    themselves.
    """
    logp = np.asarray(logp, np.float64)
    S, L, V = logp.shape
    K = min(budget, V)
    out = dict(tokens=np.zeros((S, budget), np.int32), depths=np.zeros((S, budget), np.int32),
               scores=np.full((S, budget), -np.inf), parents=np.full((S, budget + 1), -1, np.int32),
               num_nodes=np.zeros(S, np.int32))
    for s in range(S):
        order = [np.argsort(-logp[s, d], kind="stable")[:K] for d in range(L)]
        node_of = {(): 0}  # rank path -> node index
        score_of = {(): 0.0}
        heap = []

        def push(path):
            d = len(path)
            sc = score_of[path[:-1]] + logp[s, d - 1, order[d - 1][path[-1]]]
            anc = tuple(-score_of[path[:i]] for i in range(d - 1, 0, -1))
            heapq.heappush(heap, ((-sc, d) + anc + path, path, sc))

        push((0,))
        n = 0
        while heap and n < budget:
            _, path, sc = heapq.heappop(heap)
            n += 1
            d = len(path)
            node_of[path], score_of[path] = n, sc
            out["tokens"][s, n - 1] = order[d - 1][path[-1]]
            out["depths"][s, n - 1] = d
            out["scores"][s, n - 1] = sc
            out["parents"][s, n] = node_of[path[:-1]]
            if path[-1] + 1 < K:
                push(path[:-1] + (path[-1] + 1,))
            if d < L:
                push(path + (0,))
        out["num_nodes"][s] = n
    out["visibility"] = visibility_reference(out["parents"])
    out["node_mask"] = pack_bits_reference(out["visibility"])
    return out


def build_tree_reference(draft_logits, budget: int) -> dict:
    """draft_logits [S, L, V] -> the DDTree of `search_reference` on their float64 log-softmax."""
    return search_reference(log_softmax_reference(draft_logits), budget)


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
