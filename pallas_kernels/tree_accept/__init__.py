"""Accepting a verified draft tree (operation "tree_accept"): the walk, then the compaction.

    tree_accept(tree: ddtree_jax.tree.Tree, tokens [S, N] int32, posterior [S, N] int32,
                start [S] int32, active [S] bool, kv: tuple of L [S, M, Dk], taps [S, N, W])
        -> (path [S, D+1] int32, accept_len [S] int32, bonus [S] int32, path_tokens [S, D+1] int32,
            kv (compacted, same shapes), path_taps [S, D+1, W])

N = B + 1 tree nodes (node 0 the root), D = tree.max_depth. tokens are the verified tokens (root
first), posterior[s, i] the target's choice after node i. The walk (`xla.walk`, `ddtree_jax.tree.follow_tree`)
starts at the root and, at each depth, moves to the first child whose token is the target's choice
at the current node: path[d] is the node accepted at depth d (-1 past the walk's end), accept_len
counts the root, bonus is the target's choice at the last accepted node. path_tokens[d] =
tokens[path[d]] and path_taps[d] = taps[path[d]] (node 0's where path[d] = -1). For an active
stream, the latent-cache entry of path node p moves from slot start + path[p] to start + p in
every layer (p < accept_len; nodes precede their children, so path[p] >= p); other slots and
inactive streams keep theirs. Implementations: "xla" (follow_tree's parallel form, gathers and a
scatter per layer), "pallas_triton" (one kernel, one program per stream: the walk, the gathers and
every layer's compaction). Design note: docs/kernels/tree_accept.md.
"""

from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels import registry
from pallas_kernels.tree_accept import pallas_triton, xla  # noqa: F401  (registers impls)

__all__ = ["tree_accept"]


def _validate(tree, tokens, posterior, start, active, kv, taps) -> None:
    s, n = tree.parents.shape
    for name, x in (("tokens", tokens), ("posterior", posterior)):
        if getattr(x, "shape", None) != (s, n) or not jnp.issubdtype(x.dtype, jnp.integer):
            raise ValueError(f"{name} must be integer [S={s}, N={n}] like tree.parents; got "
                             f"{getattr(x, 'dtype', None)} {getattr(x, 'shape', None)}")
    if getattr(start, "shape", None) != (s,) or not jnp.issubdtype(start.dtype, jnp.integer):
        raise ValueError(f"start must be integer [S={s}]; got {getattr(start, 'shape', None)}")
    if getattr(active, "shape", None) != (s,) or active.dtype != jnp.bool_:
        raise ValueError(f"active must be bool [S={s}]; got {getattr(active, 'dtype', None)} "
                         f"{getattr(active, 'shape', None)}")
    if not kv or any(getattr(c, "ndim", None) != 3 or c.shape[0] != s or c.shape != kv[0].shape
                     for c in kv):
        raise ValueError(f"kv must be a non-empty tuple of [S={s}, M, Dk] caches of one shape; got "
                         f"{[getattr(c, 'shape', None) for c in kv]}")
    if getattr(taps, "ndim", None) != 3 or taps.shape[:2] != (s, n):
        raise ValueError(f"taps must be [S={s}, N={n}, W]; got {getattr(taps, 'shape', None)}")


def tree_accept(tree, tokens, posterior, start, active, kv, taps, *, impl: str = "auto"):
    """See the module docstring; `impl` picks the implementation ("auto": by backend)."""
    kv = tuple(kv)
    _validate(tree, tokens, posterior, start, active, kv, taps)
    return registry.get("tree_accept", impl)(tree, tokens, posterior, start, active, kv, taps)
