"""ddtree_jax.metrics against hand-computed cases and float64 goldens written as plain loops
(counts exact, floats to rtol 1e-12)."""

import math

import numpy as np
import pytest

from ddtree_jax import metrics

RTOL = 1e-12


def _golden_rates(lengths, max_length):
    """Per depth d = 1..max_length-1: steps with a >= d + 1 over steps with a >= d, by counting."""
    flat = [a for row in lengths for a in row]
    out = []
    for d in range(1, max_length):
        reached = sum(1 for a in flat if a >= d)
        out.append(sum(1 for a in flat if a >= d + 1) / reached if reached else math.nan)
    return out


def _golden_percentile(values, q):
    """Linear interpolation between the order statistics around rank q/100 * (n - 1)."""
    v = sorted(float(x) for x in values)
    rank = q / 100 * (len(v) - 1)
    lo, hi = math.floor(rank), math.ceil(rank)
    return v[lo] + (rank - lo) * (v[hi] - v[lo])


def test_hand_computed_case():
    lengths = [[1, 3, 2], [4, 1]]
    assert metrics.acceptance_histogram(lengths, 4).tolist() == [0, 2, 1, 1, 1]
    np.testing.assert_allclose(metrics.acceptance_rate_by_depth(lengths, 4), [3 / 5, 2 / 3, 1 / 2], rtol=RTOL)
    assert metrics.mean_accept_length(lengths) == pytest.approx(11 / 5, rel=RTOL)
    assert metrics.accepted_per_verified(lengths, 5) == pytest.approx(11 / 25, rel=RTOL)
    tpot = metrics.time_per_output_token([0.1, 0.1], [0.5, 0.3], [5, 1])   # one token: no TPOT
    np.testing.assert_allclose(tpot, [0.1], rtol=RTOL)
    p = metrics.percentiles([4.0, 1.0, 3.0, 2.0])
    assert p == pytest.approx({"mean": 2.5, "p50": 2.5, "p90": 3.7, "p99": 3.97}, rel=RTOL)


def test_unreached_depths_are_nan_and_none_in_the_summary():
    lengths = [[1, 2], [2]]
    rates = metrics.acceptance_rate_by_depth(lengths, 4)
    assert rates[0] == pytest.approx(2 / 3, rel=RTOL) and rates[1] == 0.0 and math.isnan(rates[2])
    s = metrics.summary(lengths, 4, 5, [[7, 8, 9], [7, 8]], [0.5, 0.5], [0.9, 0.7])
    assert s["acceptance_rate_by_depth"][1:] == [0.0, None]
    assert s["tpot_seconds"]["mean"] == pytest.approx((0.2 + 0.2) / 2, rel=RTOL)
    assert metrics.acceptance_rate_by_depth([[1, 1]], 1).shape == (0,)          # ar: no depths
    assert metrics.accepted_per_verified([[1, 1, 1]], 1) == 1.0
    assert metrics.summary([[1]], 1, 1, [[3]], [0.1], [0.1])["tpot_seconds"]["p50"] is None


def test_random_against_loops():
    rng = np.random.default_rng()
    for _ in range(20):
        max_length = int(rng.integers(1, 17))
        lengths = [rng.integers(1, max_length + 1, int(rng.integers(0, 30))).tolist()
                   for _ in range(int(rng.integers(1, 9)))]
        flat = [a for row in lengths for a in row]
        hist = metrics.acceptance_histogram(lengths, max_length)
        assert hist.tolist() == [flat.count(k) for k in range(max_length + 1)]
        np.testing.assert_allclose(metrics.acceptance_rate_by_depth(lengths, max_length),
                                   _golden_rates(lengths, max_length), rtol=RTOL, equal_nan=True)
        if flat:
            assert metrics.mean_accept_length(lengths) == pytest.approx(sum(flat) / len(flat), rel=RTOL)
            nodes = int(rng.integers(1, 70))
            assert metrics.accepted_per_verified(lengths, nodes) == pytest.approx(
                sum(flat) / (len(flat) * nodes), rel=RTOL)
            per_step = [rng.integers(1, 70, len(row)).tolist() for row in lengths]   # shared budgets
            assert metrics.accepted_per_verified(lengths, per_step) == pytest.approx(
                sum(flat) / sum(v for row in per_step for v in row), rel=RTOL)
        values = rng.exponential(size=int(rng.integers(1, 50)))
        got = metrics.percentiles(values, (50, 90, 99, 12.5))
        for q in (50, 90, 99, 12.5):
            assert got[f"p{q:g}"] == pytest.approx(_golden_percentile(values, q), rel=RTOL)
        n = rng.integers(1, 40, size=len(values))
        first = rng.uniform(0, 1, size=len(values))
        last = first + rng.uniform(0, 2, size=len(values))
        want = [(b - a) / (k - 1) for a, b, k in zip(first, last, n) if k >= 2]
        np.testing.assert_allclose(metrics.time_per_output_token(first, last, n), want, rtol=RTOL)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match=r"acceptance_lengths must lie in \[1, 3\], got \[4, 0\]"):
        metrics.acceptance_histogram([[1, 4], [0]], 3)
    with pytest.raises(ValueError, match="verified must be >= 1"):
        metrics.accepted_per_verified([[1]], 0)
    with pytest.raises(ValueError, match="one count per"):
        metrics.accepted_per_verified([[1, 2]], [[3]])
    with pytest.raises(ValueError, match="one entry per stream"):
        metrics.time_per_output_token([0.1], [0.2, 0.3], [2, 2])
    assert metrics.mean_accept_length([]) == 0.0 and math.isnan(metrics.percentiles([])["p99"])
