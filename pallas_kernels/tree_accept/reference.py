"""numpy golden of tree_accept, written from the definition: a sequential walk per stream."""

from __future__ import annotations

import numpy as np


def tree_accept_reference(parents, tokens, posterior, start, active, kv, taps, max_depth: int):
    """numpy arrays as in the operation (parents = tree.parents) -> the same tuple, kv as a list."""
    parents, tokens, posterior = (np.asarray(a) for a in (parents, tokens, posterior))
    s, n = parents.shape
    path = np.full((s, max_depth + 1), -1, np.int32)
    kv = [np.array(c) for c in kv]
    length, bonus = np.zeros(s, np.int32), np.zeros(s, np.int32)
    for i in range(s):
        cur, path[i, 0] = 0, 0
        for d in range(1, max_depth + 1):
            kids = [j for j in range(n) if parents[i, j] == cur and tokens[i, j] == posterior[i, cur]]
            if not kids:
                break
            cur = path[i, d] = kids[0]
        length[i], bonus[i] = int((path[i] >= 0).sum()), posterior[i, cur]
        if active[i]:
            for c in kv:
                moved = c[i, start[i] + path[i, :length[i]]].copy()
                c[i, start[i]:start[i] + length[i]] = moved
    node = np.maximum(path, 0)
    rows = np.arange(s)[:, None]
    return path, length, bonus, np.asarray(tokens)[rows, node], kv, np.asarray(taps)[rows, node]
