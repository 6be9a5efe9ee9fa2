"""The "tree_search" operation against the literal heap golden, the `superset` selection helper,
and Pallas:Triton lowering of every build_tree kernel (no GPU needed: catches lowering errors).

Pallas kernels run in interpret mode here, whose outputs start poisoned (NaN for floats, INT_MIN
for ints); the assemble kernel's are also handed poisoned buffers (`poison=True`: True for the bool
visibility, which interpret mode would start False), so an element a kernel fails to write cannot
match the golden. Log-probs are multiples
of 1/8, so float32 path sums are exact and must equal the float64 golden bit for bit.
"""

from __future__ import annotations

from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ddtree_jax import tree as T
from ddtree_jax.reference import tree_ref as R
from pallas_kernels import registry
from pallas_kernels import selection
from pallas_kernels.topk import pallas_triton as topk_pt
from pallas_kernels.topk.reference import topk_reference
from pallas_kernels.tree_search import num_real_nodes, pallas_triton as search_pt, tree_search
from tests.kernel_testing import fresh_rng

FIELDS = ("tokens", "depths", "parents", "visibility", "node_mask", "scores")


def _logp(rng, kind, S, L, V):
    if kind == "ints":  # heavy ties, log-prob 0 children
        return rng.integers(-2, 1, size=(S, L, V)).astype(np.float32)
    if kind == "spread":  # mostly distinct: deep lists pruned by the running threshold
        return -np.round(np.abs(rng.normal(0, 3, size=(S, L, V))) * 8).astype(np.float32) / 8
    if kind == "peaked":  # one likely token per depth: a deep tree
        x = -np.round(rng.uniform(2, 9, size=(S, L, V)) * 8).astype(np.float32) / 8
        x[:, :, 0] = -0.125
        return x
    raise ValueError(kind)


# (S, L, V, budget, kind, with lse): budget > V (no pruning at first, the selection's bisection
# and tie cut), L = 1 with fewer prefixes than budget, budget = 1, pruned lists, a deep tree, and
# the engine's default budget 64 (65 nodes: three node_mask words per row).
CASES = [(2, 4, 16, 20, "ints", True), (1, 1, 3, 10, "ints", False), (2, 3, 5, 1, "ints", True),
         (2, 5, 40, 24, "spread", True), (2, 5, 40, 24, "peaked", True), (1, 6, 40, 64, "spread", True)]


@pytest.mark.parametrize("S,L,V,budget,kind,with_lse", CASES)
def test_pallas_tree_search_matches_heap_golden(S, L, V, budget, kind, with_lse):
    """(The "xla" implementation is build_tree's CPU path: tests/framework/test_tree.py covers it.)"""
    rng = fresh_rng()
    logp = _logp(rng, kind, S, L, V)
    K = min(budget, V)
    vals, tok = topk_reference(logp.reshape(S * L, V), K)
    vals, tok = vals.reshape(S, L, K), tok.reshape(S, L, K)
    lse = np.round(rng.normal(size=(S, L)) * 8).astype(np.float32) / 8 if with_lse else None
    state = search_pt.search(jnp.asarray(vals if lse is None else vals + lse[..., None]), jnp.asarray(tok),
                             None if lse is None else jnp.asarray(lse), budget)  # vals + lse - lse is exact
    fields = search_pt.assemble(*state, num_nodes=num_real_nodes(L, K, budget), poison=True)
    gold = R.search_reference(logp, budget)
    for f in FIELDS:
        np.testing.assert_array_equal(np.asarray(fields[f]), gold[f], err_msg=f)


@pytest.mark.parametrize("args, name", [
    ((np.zeros((2, 3, 4), np.float32), np.zeros((2, 3, 4), np.int32), None, 0), "budget"),
    ((np.zeros((2, 3, 4), np.float32), np.zeros((2, 3, 4), np.int32), None, 3), "vals"),
    ((np.zeros((6, 4), np.float32), np.zeros((6, 4), np.int32), None, 4), "vals"),
    ((np.zeros((2, 3, 4), np.float32), np.zeros((2, 3, 4), np.float32), None, 4), "tok"),
    ((np.zeros((2, 3, 4), np.float32), np.zeros((2, 3, 4), np.int32), np.zeros(6), 4), "lse"),
])
def test_bad_args(args, name):
    with pytest.raises(ValueError, match=name):
        registry.get("tree_search", "xla")(*args)
    with pytest.raises(ValueError, match=name):
        tree_search(*args, impl="pallas_triton")


@pytest.mark.parametrize("impl", ["xla", "pallas_triton"])
def test_module_function_matches_heap_golden(impl):
    """tree_search(..., impl=) (the module's entry point) on one pruned case with lse."""
    rng = fresh_rng()
    S, L, V, budget = 2, 4, 12, 10
    logp = _logp(rng, "spread", S, L, V)
    vals, tok = topk_reference(logp.reshape(S * L, V), budget)
    lse = np.round(rng.normal(size=(S, L)) * 8).astype(np.float32) / 8
    fields = tree_search(jnp.asarray(vals.reshape(S, L, budget) + lse[..., None]),
                         jnp.asarray(tok.reshape(S, L, budget)), jnp.asarray(lse), budget, impl=impl)
    gold = R.search_reference(logp, budget)
    for f in FIELDS:
        np.testing.assert_array_equal(np.asarray(fields[f]), gold[f], err_msg=f)


@jax.jit
def _superset(key, valid):
    order = jnp.arange(key.shape[0])
    lo, cut, n = selection.superset(key, valid, order, 5, 8)
    return selection.in_superset(key, valid, order, lo, cut), n


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), levels=st.sampled_from([2, 6, 1000]),
       p_valid=st.floats(0.0, 1.0))
def test_superset_is_a_prefix_of_the_order(seed, levels, p_valid):
    """k = 5, cap = 8: the chosen set is the first n in (value desc, index asc), 5 <= n <= 8."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, levels, size=64).astype(np.float32) - levels / 2
    x[rng.random(64) < 0.1] = -0.0
    valid = rng.random(64) < p_valid
    sel, n = _superset(selection.keys(jnp.asarray(x)), jnp.asarray(valid))
    sel, n = np.asarray(sel), int(n)
    order = [i for i in np.argsort(-x.astype(np.float64), kind="stable") if valid[i]]
    assert n == len(order) if len(order) <= 8 else 5 <= n <= 8
    np.testing.assert_array_equal(np.flatnonzero(sel), np.sort(order[:n]))


@pytest.fixture
def compiled_kernels():
    """Lower as for the GPU (interpret mode off); drop the traces before and after."""
    jax.clear_caches()
    with mock.patch.object(topk_pt, "interpret_mode", lambda: False), \
            mock.patch.object(search_pt, "interpret_mode", lambda: False):
        yield
    jax.clear_caches()


@pytest.mark.parametrize("budget", [64, 256, 1024])
def test_build_tree_lowers_to_triton(compiled_kernels, budget):
    """The benchmark shape (S=16, L=15, V=163840): five Pallas:Triton kernels (group max, select,
    rank, search, assemble), no XLA fallback."""
    x = jax.ShapeDtypeStruct((16, 15, 163840), jnp.float32)
    for given_logprobs in (False, True):
        lowered = jax.jit(lambda x: T._build(x, budget, "pallas_triton", given_logprobs)).trace(
            x).lower(lowering_platforms=("cuda",))
        assert lowered.as_text().count("__gpu$xla.gpu.triton") == 5
