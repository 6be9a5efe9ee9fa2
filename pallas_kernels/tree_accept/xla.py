"""Pure-JAX tree_accept: the parallel walk (`walk`), gathers, and one scatter per cache layer."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels import registry


@jax.jit
def walk(tree, posterior):
    """The greedy walk from the root, in parallel: node i is taken when the target's token at its
    parent is its token (and no earlier sibling has that token, as the walk takes the first match)
    and every ancestor is taken; the taken nodes form one chain, one per depth.

    tree: any pytree with tokens [S, B], depths [S, B], parents [S, B+1], visibility
    [S, B+1, B+1] and a static max_depth L (`ddtree_jax.tree.Tree`); posterior [S, B+1] int32.
    -> accepted [S, L+1] node indices padded with -1, accept_len [S] counting the root, bonus [S].
    """
    S, B = tree.tokens.shape
    L = tree.max_depth
    rows = jnp.arange(S)[:, None]
    par = tree.parents[:, 1:]                                                      # [S, B]
    match = (par >= 0) & (tree.tokens == jnp.take_along_axis(posterior, jnp.maximum(par, 0), 1))
    same = (par[:, :, None] == par[:, None, :]) & (tree.tokens[:, :, None] == tree.tokens[:, None, :])
    first = ~jnp.any(same & jnp.tril(jnp.ones((B, B), bool), -1)[None], axis=2)   # no earlier twin
    ok = jnp.concatenate([jnp.ones((S, 1), bool), match & first], axis=1)          # [S, N]
    taken = jnp.all(~tree.visibility | ok[:, None, :], axis=2)                    # [S, N]
    depth = jnp.concatenate([jnp.zeros((S, 1), jnp.int32), tree.depths], axis=1)
    slot = jnp.where(taken, depth, L + 1)                                          # L + 1: dropped
    node = jnp.broadcast_to(jnp.arange(B + 1, dtype=jnp.int32), (S, B + 1))
    accepted = jnp.full((S, L + 1), -1, jnp.int32).at[rows, slot].set(node, mode="drop")
    accept_len = jnp.sum(taken, axis=1).astype(jnp.int32)
    last = jnp.take_along_axis(accepted, (accept_len - 1)[:, None], axis=1)
    return accepted, accept_len, jnp.take_along_axis(posterior, last, axis=1)[:, 0]


@registry.register("tree_accept", "xla")
def tree_accept_xla(tree, tokens, posterior, start, active, kv, taps):
    """See the package docstring."""
    path, accept_len, bonus = walk(tree, posterior.astype(jnp.int32))           # [S, D+1]
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
