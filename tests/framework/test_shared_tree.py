"""build_shared_tree (one budget over all streams) against its heap golden, invariants
(hypothesis), equality with build_tree when everything fits, non-finite streams and bad input."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ddtree_jax import tree as T
from ddtree_jax.reference import tree_ref as R
from tests.framework.test_tree import FIELDS, assert_tree_equal, check_tree_structure
from tests.kernel_testing import fresh_rng

# (S, L, V, cap): streams running out of prefixes below cap (V 2, V 1), cap 1 with total < S,
# one stream, cap > V. Hypothesis draws from the same shapes so jit compilations are shared.
SHAPES = [(3, 3, 7, 10), (2, 2, 2, 10), (5, 2, 4, 1), (2, 4, 16, 20), (1, 3, 5, 6), (3, 2, 1, 4)]
TOL = 2e-4  # float32 path scores against float64 (as in test_tree)


def _totals(S: int, cap: int) -> list:
    """0, 1, fewer than S, about half, one short of everything, everything, more than everything."""
    return sorted({0, 1, max(S - 1, 1), S * cap // 2, S * cap - 1, S * cap, S * cap + 3})


def _separated(logp, cap: int) -> bool:
    """True when float32 rounding cannot reorder two of the streams' first cap + 1 prefixes, within
    a stream or across streams: distinct float64 scores differ by more than TOL (equal ones come
    from equal log-probs summed alike, equal in float32 too)."""
    sc = R.search_reference(logp, cap + 1)["scores"]
    sc = np.unique(sc[np.isfinite(sc)])
    return bool(np.all(np.diff(sc) > TOL))


def _draw(rng, S, L, V, cap, make):
    """make(rng) -> float32 logits [S, L, V], redrawn until `_separated` (a near-tie is rare)."""
    for _ in range(50):
        x = make(rng).astype(np.float32)
        if _separated(R.log_softmax_reference(x), cap):
            return x
    raise AssertionError(f"no separated draw for shape {(S, L, V)}, cap {cap}")


def separated_logits(rng, S, L, V, cap) -> np.ndarray:
    """Normal float32 logits [S, L, V] (std 3) whose prefixes float32 cannot reorder (`_separated`)."""
    return _draw(rng, S, L, V, cap, lambda r: 3 * r.normal(size=(S, L, V)))


@pytest.mark.parametrize("S,L,V,cap", SHAPES)
def test_matches_shared_heap_golden(S, L, V, cap):
    x = separated_logits(fresh_rng(), S, L, V, cap)
    for total in _totals(S, cap):
        assert_tree_equal(T.build_shared_tree(jnp.asarray(x), total, cap),
                          R.build_shared_tree_reference(x, total, cap))


@pytest.mark.parametrize("S,L,V,cap", SHAPES[:4])
def test_inactive_streams_take_nothing(S, L, V, cap):
    """active [S]: the inactive streams get empty trees and the active ones share the total as the
    golden's search over them alone; share_budget cuts a built tree the same way, with the total
    a traced scalar under jit (one compilation for every total)."""
    rng = fresh_rng()
    x = separated_logits(rng, S, L, V, cap)
    active = rng.random(S) < 0.6
    active[0] = not active[-1] if S > 1 else True
    full = T.build_tree(jnp.asarray(x), cap)
    share = jax.jit(lambda t, n, a: T.share_budget(t, n, active=a))
    for total in _totals(S, cap):
        gold = R.build_shared_tree_reference(x, total, cap, active)
        got = T.build_shared_tree(jnp.asarray(x), total, cap, active=jnp.asarray(active))
        assert_tree_equal(got, gold)
        assert not np.asarray(got.num_nodes)[~active].any()
        assert_tree_equal(share(full, jnp.int32(total), jnp.asarray(active)), gold)


@pytest.mark.parametrize("S,L,V,cap", SHAPES)
def test_repeated_logits_and_copied_streams_match_golden(S, L, V, cap):
    """Each depth's logits take 3 values (tied tokens), and the last stream copies the first
    (tied streams: the lower stream goes first)."""
    def make(r):
        palette = 3 * r.normal(size=(S, L, 3))
        x = np.take_along_axis(palette, r.integers(0, 3, size=(S, L, V)), axis=2)
        x[-1] = x[0]
        return x

    x = _draw(fresh_rng(), S, L, V, cap, make)
    for total in _totals(S, cap):
        assert_tree_equal(T.build_shared_tree(jnp.asarray(x), total, cap),
                          R.build_shared_tree_reference(x, total, cap))


@pytest.mark.parametrize("S,L,V,cap", SHAPES)
def test_integer_logprobs_ties_match_golden_exactly(S, L, V, cap):
    """Small-integer log-probs: exact sums, ties within and across streams at every step."""
    logp = fresh_rng().integers(-2, 1, size=(S, L, V)).astype(np.float32)
    for total in _totals(S, cap):
        assert_tree_equal(T.build_shared_tree_from_logprobs(jnp.asarray(logp), total, cap),
                          R.shared_search_reference(logp, total, cap))


def test_pallas_topk_path_matches_golden():
    logp = fresh_rng().integers(-3, 1, size=(3, 3, 12)).astype(np.float32)
    for total in (4, 11):
        assert_tree_equal(T.build_shared_tree_from_logprobs(jnp.asarray(logp), total, 5,
                                                            topk_impl="pallas_triton"),
                          R.shared_search_reference(logp, total, 5))


def _assert_same(got, want):
    for f in FIELDS + ("scores",):
        np.testing.assert_array_equal(np.asarray(getattr(got, f)), np.asarray(getattr(want, f)), f)


@pytest.mark.parametrize("S,L,V,cap", SHAPES)
def test_everything_fits_equals_build_tree(S, L, V, cap):
    x = jnp.asarray(3 * fresh_rng().normal(size=(S, L, V)), jnp.float32)
    want = T.build_tree(x, cap)
    for total in (S * cap, S * cap + 7):
        got = T.build_shared_tree(x, total, cap)
        assert got.max_depth == want.max_depth
        _assert_same(got, want)


def test_jit_with_static_total_and_cap_matches_eager():
    x = jnp.asarray(3 * fresh_rng().normal(size=(3, 3, 7)), jnp.float32)
    jitted = jax.jit(T.build_shared_tree, static_argnums=(1, 2))
    for total in (2, 13):
        got, want = jitted(x, total, 10), T.build_shared_tree(x, total, 10)
        _assert_same(got, want)


def test_non_finite_streams_get_no_nodes_and_take_no_budget():
    """Under jit, streams whose logits hold NaN, +inf or an all -inf depth get empty trees; the
    others share the whole total (a single -inf logit is a probability-0 token, not an error)."""
    S, L, V, cap = 5, 3, 5, 6
    rng = fresh_rng()
    good = np.array([False, True, False, True, False])
    x = np.zeros((S, L, V), np.float32)
    x[good] = _draw(rng, 2, L, V, cap, lambda r: 3 * r.normal(size=(2, L, V)))
    x[~good] = 3 * rng.normal(size=(3, L, V))
    x[0, 1, 2], x[2, 0, 4], x[4, 2, :] = np.nan, np.inf, -np.inf
    x[1, 0, 3] = -np.inf
    for total in (0, 1, 5, 9, 12, 30):
        got = jax.jit(T.build_shared_tree, static_argnums=(1, 2))(jnp.asarray(x), total, cap)
        gold = R.build_shared_tree_reference(x, total, cap)
        assert_tree_equal(got, gold)
        assert not np.asarray(got.num_nodes)[~good].any()
        assert int(np.asarray(got.num_nodes).sum()) == min(total, 2 * cap)
        alone = R.build_shared_tree_reference(x[good], total, cap)  # as if they were not there
        for f in FIELDS:
            np.testing.assert_array_equal(np.asarray(getattr(got, f))[good], alone[f], f)


@settings(max_examples=30, deadline=None)
@given(data=st.data(), shape=st.sampled_from(SHAPES), seed=st.integers(0, 2**31 - 1),
       ties=st.booleans())
def test_invariants(data, shape, seed, ties):
    """Prefix-closed trees that are prefixes of each stream's build_tree list, no stream above
    cap, min(total, available) nodes in all, every taken score >= every untaken candidate's."""
    S, L, V, cap = shape
    total = data.draw(st.integers(0, S * cap + 3), label="total")
    rng = np.random.default_rng(seed)
    x = (rng.integers(-2, 1, size=(S, L, V)) if ties else 3 * rng.normal(size=(S, L, V)))
    x = jnp.asarray(x, jnp.float32)
    tree, full = T.build_shared_tree(x, total, cap), T.build_tree(x, cap)
    logp = R.log_softmax_reference(np.asarray(x))
    check_tree_structure(tree, logp)
    n, avail = np.asarray(tree.num_nodes), np.asarray(full.num_nodes)
    assert np.all(n <= cap) and np.all(n <= avail)
    assert n.sum() == min(total, avail.sum())
    for s in range(S):   # stream s holds the first n[s] nodes of its own best-first list
        for f in ("tokens", "depths", "scores"):
            np.testing.assert_array_equal(np.asarray(getattr(tree, f))[s, :n[s]],
                                          np.asarray(getattr(full, f))[s, :n[s]], f)
        np.testing.assert_array_equal(np.asarray(tree.parents)[s, :n[s] + 1],
                                      np.asarray(full.parents)[s, :n[s] + 1])
    sc, full_sc = np.asarray(tree.scores), np.asarray(full.scores)
    taken = np.arange(cap)[None, :] < n[:, None]
    untaken = ~taken & (np.arange(cap)[None, :] < avail[:, None])
    if taken.any() and untaken.any():
        assert sc[taken].min() >= full_sc[untaken].max()
        # and in float64: no stream's next prefix (the first it did not get) outscores a taken one
        gold = R.search_reference(logp, cap)["scores"]
        assert gold[taken].min() >= gold[untaken].max() - TOL
    # the accept walk runs on it unchanged
    post = rng.integers(0, V, size=(S, cap + 1)).astype(np.int32)
    got = T.follow_tree(tree, jnp.asarray(post))
    for g, w in zip(got, R.follow_tree_reference(np.asarray(tree.tokens), np.asarray(tree.parents),
                                                 post, L)):
        np.testing.assert_array_equal(np.asarray(g), w)


@pytest.mark.parametrize("total", [-1, 2.5, True, None, "3"])
def test_bad_total(total):
    with pytest.raises(ValueError, match="total must be an int >= 0"):
        T.build_shared_tree(jnp.zeros((2, 2, 4)), total, 3)


def test_bad_active_and_tree():
    x = jnp.zeros((2, 2, 4))
    for bad in (jnp.ones((3,), bool), jnp.ones((2,), jnp.int32), [True, False]):
        with pytest.raises(ValueError, match=r"active must be bool \[S=2\]"):
            T.build_shared_tree(x, 3, 2, active=bad)
    with pytest.raises(ValueError, match="tree must be a Tree"):
        T.share_budget({"tokens": x}, 3)
    with pytest.raises(ValueError, match="total must be an int >= 0"):
        T.share_budget(T.build_tree(x, 2), -1)


@pytest.mark.parametrize("cap", [0, -2, 1.0, False, None])
def test_bad_cap(cap):
    with pytest.raises(ValueError, match="cap must be an int >= 1"):
        T.build_shared_tree(jnp.zeros((2, 2, 4)), 3, cap)


def test_numpy_int_arguments_accepted():
    x = jnp.asarray(3 * fresh_rng().normal(size=(2, 2, 4)), jnp.float32)
    got = T.build_shared_tree(x, np.int64(3), np.int32(4))
    assert int(np.asarray(got.num_nodes).sum()) == 3 and got.tokens.shape == (2, 4)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_concrete_non_finite_logits_rejected(bad):
    x = np.zeros((2, 3, 5), np.float32)
    x[1, 2, 3] = bad
    with pytest.raises(ValueError, match="draft_logits.*non-finite"):
        T.build_shared_tree(jnp.asarray(x), 4, 3)


@pytest.mark.parametrize("shape", [(4, 5), (1, 2, 3, 4), (0, 2, 3)])
def test_bad_rank(shape):
    with pytest.raises(ValueError, match="draft_logits"):
        T.build_shared_tree(jnp.zeros(shape), 4, 3)
