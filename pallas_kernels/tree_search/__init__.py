"""Operation "tree_search": the DDTree search and tree assembly from each depth's top-K tokens.

    tree_search(vals [S, L, K] float32 (rows descending), tok [S, L, K] int32,
                lse [S, L] float32 or None, budget B) -> dict of
        tokens [S, B], depths [S, B], parents [S, B+1], visibility [S, B+1, B+1] bool,
        node_mask [S, B+1, ceil((B+1)/32)] int32, scores [S, B] float32, num_nodes [S] int32

Called as `tree_search(vals, tok, lse, budget, impl="auto")`, or through the registry.
Per-depth log-probs are max(vals - lse, -1e30) (vals as given when lse is None); K = min(B, V).
The tree is the B best prefixes in `ddtree_jax.tree`'s node order (its docstring has the order and
the padding), exactly as the heap golden `ddtree_jax.reference.tree_ref.search_reference` builds it.
Implementations, each two stages (`stages(impl)` -> (search, assemble), for timing):
  "xla":           per-depth jax.lax.top_k over the candidate pairs, then a searchsorted merge,
                   scatters and an ancestor loop (`pallas_kernels.tree_search.xla`);
  "pallas_triton": one kernel for all depths and the merge, one for the assembly
                   (`pallas_kernels.tree_search.pallas_triton`).
Design note: docs/kernels/tree_search.md.
"""

from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels import registry
from pallas_kernels.tree_search import pallas_triton, xla


def num_real_nodes(L: int, V: int, budget: int) -> int:
    """Nodes a tree of `budget` holds: min(budget, sum_d min(budget, V**d))."""
    total, n = 0, 1
    for _ in range(L):
        n = min(budget, n * V)
        total += n
    return min(budget, total)


def stages(impl: str):
    """(search(vals, tok, lse, budget) -> state, assemble(state, num_nodes) -> fields) of `impl`:
    the two halves of the operation, for timing them apart."""
    if impl not in _STAGES:
        raise ValueError(f"tree_search has no implementation {impl!r}; available: {tuple(_STAGES)}")
    return _STAGES[impl]


_STAGES = {
    "xla": (xla.search, lambda state, num_nodes: xla.assemble(*state, num_nodes)),
    # (the search's merged list already holds exactly num_nodes real entries)
    "pallas_triton": (pallas_triton.search,
                      lambda state, num_nodes: pallas_triton.assemble(*state, num_nodes=num_nodes)),
}


def check_args(vals, tok, lse, budget) -> None:
    """Raise ValueError unless the arguments have the operation's shapes and types."""
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
        raise ValueError(f"budget must be an int >= 1; got {budget!r}")
    shape = getattr(vals, "shape", None)
    if getattr(vals, "ndim", None) != 3 or not jnp.issubdtype(vals.dtype, jnp.floating) \
            or not 1 <= shape[2] <= budget:
        raise ValueError(f"vals must be float [S, L, K] with 1 <= K <= budget; got "
                         f"{getattr(vals, 'dtype', None)} {shape}")
    if getattr(tok, "shape", None) != shape or not jnp.issubdtype(tok.dtype, jnp.integer):
        raise ValueError(f"tok must be integer with vals' shape {shape}; got "
                         f"{getattr(tok, 'dtype', None)} {getattr(tok, 'shape', None)}")
    if lse is not None and getattr(lse, "shape", None) != shape[:2]:
        raise ValueError(f"lse must be None or [S, L] = {shape[:2]}; got "
                         f"{getattr(lse, 'shape', None)}")


def tree_search(vals, tok, lse, budget: int, *, impl: str = "auto") -> dict:
    """The operation (module docstring) by implementation `impl` ("auto": the registry's choice)."""
    check_args(vals, tok, lse, budget)
    return registry.get("tree_search", impl)(vals, tok, lse, budget)


def _register(impl: str):
    search, assemble = _STAGES[impl]

    def tree_search(vals, tok, lse, budget: int) -> dict:
        check_args(vals, tok, lse, budget)
        S, L, K = vals.shape
        return assemble(search(vals, tok, lse, budget), num_real_nodes(L, K, budget))

    registry.register("tree_search", impl)(tree_search)


for _impl in _STAGES:
    _register(_impl)
