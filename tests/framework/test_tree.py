"""build_tree / follow_tree against the heap golden, invariants (hypothesis), and bad input."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ddtree_jax import tree as T
from ddtree_jax.reference import tree_ref as R
from tests.kernel_testing import fresh_rng

FIELDS = ("tokens", "depths", "parents", "num_nodes", "visibility", "node_mask")
# (S, L, V, budget): budget > V, budget = 1, L = 1, fewer prefixes than budget, budget >> V^1.
# Hypothesis tests draw from the same shapes so jit compilations are shared (CPU time budget).
SHAPES = [(2, 4, 16, 20), (1, 1, 3, 10), (2, 2, 2, 10), (3, 3, 7, 40), (2, 3, 5, 1),
          (2, 6, 4, 30), (1, 1, 40, 8)]


def assert_tree_equal(tree, gold):
    """Every Tree field equals the golden's; scores within float32 rounding."""
    for f in FIELDS:
        np.testing.assert_array_equal(np.asarray(getattr(tree, f)), gold[f], err_msg=f)
    np.testing.assert_allclose(np.asarray(tree.scores), gold["scores"], rtol=0, atol=2e-4)


def _no_near_ties(gold_plus, budget, tol=2e-4) -> bool:
    """True when float32 rounding cannot reorder the first budget+1 golden nodes."""
    n = int(gold_plus["num_nodes"][0]) if gold_plus["num_nodes"].size else 0
    sc = gold_plus["scores"][:, :min(budget + 1, n)]
    return bool(np.all(-np.diff(sc, axis=1) > tol))


@pytest.mark.parametrize("S,L,V,budget", SHAPES)
def test_build_tree_matches_heap_golden(S, L, V, budget):
    rng = np.random.default_rng(hash((S, L, V, budget)) % 2**32)
    exact = 0
    for _ in range(3):
        x = (3 * rng.normal(size=(S, L, V))).astype(np.float32)
        tree = T.build_tree(jnp.asarray(x), budget)
        gold_plus = R.build_tree_reference(x, budget + 1)
        if _no_near_ties(gold_plus, budget):
            assert_tree_equal(tree, R.build_tree_reference(x, budget))
            exact += 1
        else:  # a near-tie may flip under float32: same scores, still a valid tree
            gold = R.build_tree_reference(x, budget)
            np.testing.assert_allclose(np.asarray(tree.scores), gold["scores"], atol=2e-4)
            _check_invariants(tree, x)
    assert exact >= 2


@pytest.mark.parametrize("S,L,V,budget", SHAPES[:5])
def test_ties_match_golden_exactly(S, L, V, budget):
    """Small-integer log-probs: exact sums, many ties, probability-1 tokens (logp 0)."""
    rng = np.random.default_rng(7 + budget)
    logp = rng.integers(-2, 1, size=(S, L, V)).astype(np.float32)
    assert_tree_equal(T.build_tree_from_logprobs(jnp.asarray(logp), budget),
                      R.search_reference(logp, budget))


def test_pallas_topk_path_matches():
    rng = fresh_rng()
    logp = rng.integers(-3, 1, size=(2, 3, 12)).astype(np.float32)
    assert_tree_equal(T.build_tree_from_logprobs(jnp.asarray(logp), 5, topk_impl="pallas_triton"),
                      R.search_reference(logp, 5))


@pytest.mark.parametrize("impl", ["xla", "pallas_triton"])
def test_bf16_logits_give_the_tree_of_their_float32_values(impl):
    """bf16 draft logits (a bf16 drafter's lm_head output) are read as they are: the tree equals
    the one built from the same values in float32 (bf16 -> float32 is exact)."""
    rng = fresh_rng()
    x = jnp.asarray(3 * rng.normal(size=(2, 3, 40)), jnp.bfloat16)
    got = T.build_tree(x, 12, topk_impl=impl)
    want = T.build_tree(x.astype(jnp.float32), 12, topk_impl=impl)
    for f in FIELDS + ("scores",):
        np.testing.assert_array_equal(np.asarray(getattr(got, f)), np.asarray(getattr(want, f)), f)


def test_jit_matches_eager():
    x = jax.random.normal(jax.random.key(0), (2, 4, 16)) * 3
    eager = T.build_tree(x, 20)
    jitted = jax.jit(T.build_tree, static_argnums=1)(x, 20)
    for f in FIELDS + ("scores",):
        np.testing.assert_array_equal(np.asarray(getattr(jitted, f)), np.asarray(getattr(eager, f)))


def _check_invariants(tree, x):
    S, L, V = x.shape
    B = tree.tokens.shape[1]
    assert np.all(np.asarray(tree.num_nodes) == T.num_real_nodes(L, V, B))
    check_tree_structure(tree, R.log_softmax_reference(x))


def check_tree_structure(tree, logp):
    """Invariants of any Tree built from per-depth log-probs logp [S, L, V]: per stream, nodes
    1..num_nodes are distinct prefixes after their parents with non-increasing path scores, the
    rest padding; visibility and node_mask follow the parents."""
    S, L, V = logp.shape
    B = tree.tokens.shape[1]
    tok, dep, par = (np.asarray(a) for a in (tree.tokens, tree.depths, tree.parents))
    vis, sc, num = np.asarray(tree.visibility), np.asarray(tree.scores), np.asarray(tree.num_nodes)
    for s in range(S):
        n_real = num[s]
        assert 0 <= n_real <= B
        assert par[s, 0] == -1
        seen = set()
        for i in range(1, B + 1):
            if i > n_real:  # padding: invisible, never a parent
                assert (tok[s, i - 1], dep[s, i - 1], par[s, i]) == (0, 0, -1)
                assert not np.isfinite(sc[s, i - 1])
                continue
            p = par[s, i]
            assert 0 <= p < i  # parents precede children (prefix-closed)
            assert dep[s, i - 1] == (dep[s, p - 1] if p else 0) + 1
            assert 1 <= dep[s, i - 1] <= L
            # path score = parent's score + this depth's log-prob
            want = (sc[s, p - 1] if p else 0.0) + logp[s, dep[s, i - 1] - 1, tok[s, i - 1]]
            assert abs(sc[s, i - 1] - want) < 1e-3 * max(1.0, abs(want))
            path = (p, tok[s, i - 1])
            assert path not in seen  # distinct prefixes
            seen.add(path)
        real = sc[s, :n_real]
        assert np.all(np.diff(real) <= 0)  # non-increasing score
    np.testing.assert_array_equal(vis, R.visibility_reference(par))
    np.testing.assert_array_equal(np.asarray(tree.node_mask), R.pack_bits_reference(vis))
    assert np.all(par[:, 1:] <= num[:, None])  # never a padding parent


@settings(max_examples=25, deadline=None)
@given(shape=st.sampled_from(SHAPES), seed=st.integers(0, 2**31 - 1), ties=st.booleans())
def test_invariants(shape, seed, ties):
    S, L, V, budget = shape
    rng = np.random.default_rng(seed)
    x = (rng.integers(-2, 1, size=(S, L, V)) if ties else 3 * rng.normal(size=(S, L, V)))
    x = x.astype(np.float32)
    _check_invariants(T.build_tree(jnp.asarray(x), budget), x)


@settings(max_examples=20, deadline=None)
@given(shape=st.sampled_from(SHAPES), seed=st.integers(0, 2**31 - 1),
       p_follow=st.floats(0.0, 1.0))
def test_follow_tree_matches_golden(shape, seed, p_follow):
    S, L, V, budget = shape
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(S, L, V)).astype(np.float32)
    tree = T.build_tree(jnp.asarray(x), budget)
    tok, par = np.asarray(tree.tokens), np.asarray(tree.parents)
    # The target's token at each node: often one of its children's tokens, else a random id.
    post = rng.integers(0, min(V, 3), size=(S, budget + 1)).astype(np.int32)
    for s in range(S):
        for i in range(budget + 1):
            kids = [c for c in range(1, budget + 1) if par[s, c] == i]
            if kids and rng.random() < p_follow:
                post[s, i] = tok[s, rng.choice(kids) - 1]
    acc, n, bonus = T.follow_tree(tree, jnp.asarray(post))
    g_acc, g_n, g_bonus = R.follow_tree_reference(tok, par, post, L)
    np.testing.assert_array_equal(np.asarray(acc), g_acc)
    np.testing.assert_array_equal(np.asarray(n), g_n)
    np.testing.assert_array_equal(np.asarray(bonus), g_bonus)


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), S=st.sampled_from([1, 3]), B=st.sampled_from([1, 9, 40]),
       L=st.sampled_from([1, 6]), V=st.sampled_from([1, 3]))
def test_follow_tree_on_arbitrary_trees_matches_golden(seed, S, B, L, V):
    """Any tree, also with repeated sibling tokens (the walk takes the first match)."""
    rng = np.random.default_rng(seed)
    par = np.full((S, B + 1), -1, np.int32)
    depth = np.zeros((S, B + 1), np.int32)
    for s in range(S):
        for i in range(1, B + 1):
            par[s, i] = rng.choice([j for j in range(i) if depth[s, j] < L])
            depth[s, i] = depth[s, par[s, i]] + 1
    tok = rng.integers(0, V, size=(S, B)).astype(np.int32)
    vis = T.ancestors(jnp.asarray(par), L)
    tree = T.Tree(tokens=jnp.asarray(tok), depths=jnp.asarray(depth[:, 1:]), parents=jnp.asarray(par),
                  num_nodes=jnp.full((S,), B, jnp.int32), visibility=vis, node_mask=T.pack_bits(vis),
                  scores=jnp.zeros((S, B)), max_depth=L)
    post = rng.integers(0, V, size=(S, B + 1)).astype(np.int32)
    got = T.follow_tree(tree, jnp.asarray(post))
    for g, w in zip(got, R.follow_tree_reference(tok, par, post, L)):
        np.testing.assert_array_equal(np.asarray(g), w)


def test_follow_tree_full_path():
    """A target that agrees with the draft's best chain accepts all L tokens plus the bonus."""
    tree = T.build_tree(jnp.zeros((2, 6, 4)).at[:, :, 2].set(5.0), 30)
    post = jnp.full((2, 31), 2, jnp.int32)
    acc, n, bonus = T.follow_tree(tree, post)
    np.testing.assert_array_equal(np.asarray(acc), [[0, 1, 2, 3, 4, 5, 6]] * 2)
    assert np.all(np.asarray(n) == 7) and np.all(np.asarray(bonus) == 2)


@pytest.mark.parametrize("budget", [0, -3, 2.5, True, None])
def test_bad_budget(budget):
    with pytest.raises(ValueError, match="budget must be an int >= 1"):
        T.build_tree(jnp.zeros((1, 2, 4)), budget)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_logits(bad):
    x = np.zeros((2, 3, 5), np.float32)
    x[1, 2, 3] = bad
    with pytest.raises(ValueError, match="draft_logits.*non-finite"):
        T.build_tree(jnp.asarray(x), 4)


@pytest.mark.parametrize("shape", [(4, 5), (1, 2, 3, 4), (0, 2, 3), ()])
def test_bad_rank(shape):
    with pytest.raises(ValueError, match="draft_logits"):
        T.build_tree(jnp.zeros(shape), 4)


def test_integer_logits_rejected():
    with pytest.raises(ValueError, match="floating"):
        T.build_tree(jnp.zeros((1, 2, 3), jnp.int32), 4)


def test_bad_posterior():
    tree = T.build_tree(jnp.zeros((2, 2, 3)), 5)
    with pytest.raises(ValueError, match="posterior"):
        T.follow_tree(tree, jnp.zeros((2, 5), jnp.int32))
    with pytest.raises(ValueError, match="posterior"):
        T.follow_tree(tree, jnp.zeros((2, 6), jnp.float32))


@pytest.mark.parametrize("impl", ["xla", "pallas_triton"])
def test_a_stream_with_non_finite_logits_gets_an_empty_tree_under_jit(impl):
    """Under jit build_tree cannot raise: a stream whose logits hold NaN or +inf gets a tree of
    padding only (no draft token verified, so the step stays lossless); the others are unchanged."""
    rng = np.random.default_rng(int(np.random.SeedSequence().generate_state(1)[0]))
    x = rng.standard_normal((3, 4, 64)).astype(np.float32)
    want = T.build_tree(jnp.asarray(x), 6, topk_impl=impl)
    x[0, 2, 5], x[2, 0, 1] = np.nan, np.inf
    got = jax.jit(lambda v: T.build_tree(v, 6, topk_impl=impl))(jnp.asarray(x))
    assert np.asarray(got.num_nodes).tolist() == [0, int(want.num_nodes[1]), 0]
    for s in (0, 2):
        assert not np.asarray(got.tokens[s]).any() and not np.asarray(got.depths[s]).any()
        assert (np.asarray(got.parents[s]) == -1).all()
        np.testing.assert_array_equal(np.asarray(got.visibility[s]), np.eye(7, dtype=bool))
    for f in ("tokens", "depths", "parents", "visibility", "node_mask"):
        np.testing.assert_array_equal(np.asarray(getattr(got, f))[1], np.asarray(getattr(want, f))[1])
    acc, n, _ = T.follow_tree(got, jnp.zeros((3, 7), jnp.int32))
    assert np.asarray(n).tolist()[0] == 1 and np.asarray(n).tolist()[2] == 1
