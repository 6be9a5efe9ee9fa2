"""Cost-aware budget: the expected acceptance formula against brute-force enumeration, the argmax."""

import itertools

import jax.numpy as jnp
import numpy as np
import pytest

import ddtree_jax as dj
from ddtree_jax import budget


def _brute_force_acceptance(logits: np.ndarray, tree: dj.Tree) -> float:
    """E[accept_len] when the target draws depth d's token from softmax(logits[d]), by enumerating
    every target sequence and walking the tree with follow_tree."""
    L, V = logits.shape
    q = np.exp(logits - logits.max(-1, keepdims=True))
    q /= q.sum(-1, keepdims=True)
    seqs = np.array(list(itertools.product(range(V), repeat=L)))              # [V^L, L]
    prob = np.prod(q[np.arange(L), seqs], axis=1)
    n = len(seqs)
    batch = dj.Tree(**{f: jnp.broadcast_to(getattr(tree, f), (n,) + getattr(tree, f).shape[1:])
                       for f in ("tokens", "depths", "parents", "num_nodes", "visibility", "node_mask",
                                 "scores")}, max_depth=tree.max_depth)
    depth = np.concatenate([[0], np.asarray(tree.depths[0])])                  # node -> depth
    # the target's token after a node at depth k is the sequence's token k (0 past the last depth)
    padded = np.concatenate([seqs, np.zeros((n, 1), int)], axis=1)
    posterior = padded[:, np.minimum(depth, L)]
    _, acc_len, _ = dj.follow_tree(batch, jnp.asarray(posterior, jnp.int32))
    return float(np.sum(prob * np.asarray(acc_len)))


@pytest.mark.parametrize("seed", [0, 1])
def test_expected_acceptance_matches_enumeration(seed):
    L, V, B = 3, 3, 12
    logits = np.random.default_rng(seed).normal(0, 1.5, (L, V)).astype(np.float32)
    big = dj.build_tree(jnp.asarray(logits)[None], B)
    expected = budget.expected_acceptance(np.asarray(big.scores))[0]
    for b in (2, B):
        tree = dj.build_tree(jnp.asarray(logits)[None], b)
        want = _brute_force_acceptance(logits, tree)
        np.testing.assert_allclose(expected[b - 1], want, rtol=1e-5)
        np.testing.assert_allclose(budget.expected_acceptance(np.asarray(tree.scores))[0, -1], want,
                                   rtol=1e-5)


def test_expected_acceptance_padding_adds_nothing():
    e = budget.expected_acceptance(np.array([np.log(0.5), np.log(0.25), -np.inf]))
    np.testing.assert_allclose(e, [1.5, 1.75, 1.75])


def test_best_budget_is_the_argmax_of_rate():
    b = np.arange(1, 257)
    expected = 1 + 4 * (1 - np.exp(-b / 24))
    curve = budget.StepTimeCurve((256, 1, 64), (9e-3, 1e-3, 3e-3))           # unsorted on purpose
    t = np.interp(b, [1, 64, 256], [1e-3, 3e-3, 9e-3])
    choice = budget.best_budget(expected, curve)
    assert choice.budget == int(b[np.argmax(expected / t)])
    assert choice.rate == pytest.approx(np.max(expected / t))
    assert choice.expected_tau == pytest.approx(expected[choice.budget - 1])


def test_best_budget_extremes():
    expected = 1 + np.cumsum(np.full(100, 0.05))
    flat = budget.StepTimeCurve((1, 64), (1e-3, 1e-3))
    assert budget.best_budget(expected, flat).budget == 64        # never past the measured range
    steep = budget.StepTimeCurve((1, 2, 64), (1e-3, 1e-2, 1.0))
    assert budget.best_budget(expected, steep).budget == 1


@pytest.mark.parametrize("budgets, seconds", [((), ()), ((1, 2), (1.0,)), ((1, 1), (1.0, 2.0)),
                                              ((1, 2), (1.0, 0.0))])
def test_step_time_curve_rejects_bad_input(budgets, seconds):
    with pytest.raises(ValueError):
        budget.StepTimeCurve(budgets, seconds)


def _rates_gold(logits, cap, active, curve):
    from ddtree_jax.reference import tree_ref
    return tree_ref.shared_total_reference(tree_ref.log_softmax_reference(logits), cap, active,
                                           curve.budgets, curve.seconds)


def _shared_total(logits, cap, active, curve) -> int:
    tree = dj.build_tree(jnp.asarray(logits), cap)
    return int(budget.shared_total(tree.scores, tree.num_nodes, jnp.asarray(active), curve))


@pytest.mark.parametrize("S, L, V, cap", [(4, 3, 6, 5), (3, 2, 2, 8), (6, 4, 16, 3)])
def test_shared_total_matches_golden(S, L, V, cap):
    """The per-step shared budget (the best expected rate over the ranked union) against the
    float64 golden's enumeration: its golden rate is the best within float32 rounding (1e-5), and
    it is the golden's N wherever the best rate beats every other by more than 1e-4. Curves that
    rise, bend and stop below the available nodes; inactive streams; (3, 2, 2, 8): streams with
    fewer prefixes than the cap."""
    from tests.framework.test_shared_tree import separated_logits
    from tests.kernel_testing import fresh_rng

    rng = fresh_rng()
    logits = separated_logits(rng, S, L, V, cap)
    active = rng.random(S) < 0.7
    active[0] = True
    curves = [budget.StepTimeCurve((0, S * cap), (1.0, 1.0 + 0.1 * rng.random())),
              budget.StepTimeCurve((1, 4, S * cap), (1.0, 1.05, 3.0)),
              budget.StepTimeCurve((0, 2, 5), (0.5, 0.6, 2.0))]
    for curve in curves:
        n = _shared_total(logits, cap, active, curve)
        best, rate = _rates_gold(logits, cap, active, curve)
        assert 0 <= n < rate.size and rate[n] >= rate.max() * (1 - 1e-5), (curve, n, best, rate)
        if np.all(np.delete(rate, best) < rate[best] * (1 - 1e-4)):
            assert n == best, (curve, n, best, rate)


def test_shared_total_extremes():
    """A flat curve takes every node up to its largest total; a steep one none; a finished stream
    adds neither nodes nor its bonus token."""
    logits = np.random.default_rng(0).normal(0, 2, (3, 3, 8)).astype(np.float32)
    active = np.array([True, False, True])
    flat = budget.StepTimeCurve((0, 4), (1.0, 1.0))
    assert _shared_total(logits, 5, active, flat) == 4
    assert _shared_total(logits, 5, active, budget.StepTimeCurve((0, 100), (1.0, 1.0))) == 10
    assert _shared_total(logits, 5, active, budget.StepTimeCurve((0, 1), (1e-3, 1.0))) == 0
    assert _shared_total(logits, 5, np.zeros(3, bool), flat) == 0
