"""Pure-JAX tree_accept: follow_tree's parallel walk, gathers, and one scatter per cache layer."""

from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels import registry


@registry.register("tree_accept", "xla")
def tree_accept_xla(tree, tokens, posterior, start, active, kv, taps):
    """See the package docstring."""
    from ddtree_jax.tree import follow_tree   # ddtree_jax.tree imports the kernel registry

    path, accept_len, bonus = follow_tree(tree, posterior)                       # [S, D+1]
    node = jnp.maximum(path, 0)
    s, depth = path.shape
    j = jnp.arange(depth, dtype=jnp.int32)[None, :]
    rows = jnp.arange(s)[:, None]
    keep = jnp.where(active, accept_len, 0)
    src = start[:, None] + node
    dst = jnp.where(j < keep[:, None], start[:, None] + j, kv[0].shape[1])       # past M: dropped
    kv = tuple(c.at[rows, dst].set(c[rows, src], mode="drop") for c in kv)
    return (path, accept_len, bonus, jnp.take_along_axis(tokens, node, axis=1), kv,
            jnp.take_along_axis(taps, node[..., None], axis=1))
