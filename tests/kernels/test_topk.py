"""The "topk" operation: every implementation against the numpy golden (ties -> lower index)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pallas_kernels import topk as topk_op
from pallas_kernels.topk.reference import logsumexp_reference, topk_reference
from tests.kernel_testing import fresh_rng, runnable_impls


def _draw(rng, kind, R, V):
    if kind == "normal":
        return rng.normal(size=(R, V)).astype(np.float32) * 4
    if kind == "ints":  # many ties
        return rng.integers(-3, 3, size=(R, V)).astype(np.float32)
    if kind == "const":
        return np.full((R, V), -1.5, np.float32)
    if kind == "zeros":  # -0.0 and 0.0 are equal
        return rng.choice(np.array([0.0, -0.0, 1.0, -np.inf], np.float32), size=(R, V))
    if kind == "zero_ties":  # the tie at the k-th place is between -0.0 and 0.0
        return rng.choice(np.array([0.0, -0.0, -1.0], np.float32), size=(R, V))
    if kind == "neg_inf":  # rows of -inf only: lse -inf
        return np.full((R, V), -np.inf, np.float32)
    raise ValueError(kind)


# Few distinct shapes: each one compiles the interpret-mode kernels once (CPU time budget).
CASES = [(3, 37, 5, "normal"), (3, 37, 5, "zeros"), (3, 37, 5, "zero_ties"), (3, 37, 5, "neg_inf"), (2, 300, 20, "ints"), (2, 300, 20, "const"),
         (2, 64, 64, "ints"), (1, 1, 1, "normal")]


@pytest.mark.parametrize("impl", runnable_impls("topk"))
@pytest.mark.parametrize("R,V,k,kind", CASES)
def test_topk_matches_golden(impl, R, V, k, kind):
    x = _draw(fresh_rng(), kind, R, V)
    values, indices, lse = topk_op.topk_logsumexp(jnp.asarray(x), k, impl=impl)
    want_v, want_i = topk_reference(x, k)
    np.testing.assert_array_equal(np.asarray(indices), want_i)
    np.testing.assert_array_equal(np.asarray(values), want_v)
    np.testing.assert_allclose(np.asarray(lse), logsumexp_reference(x), rtol=1e-6, atol=1e-6)
    v2, i2 = topk_op.topk(jnp.asarray(x), k, impl=impl)
    np.testing.assert_array_equal(np.asarray(i2), want_i)
    np.testing.assert_array_equal(np.asarray(v2), want_v)


@pytest.mark.parametrize("impl", runnable_impls("topk"))
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("kind", ["normal", "ints", "zeros"])
def test_half_precision_input_is_read_exactly(impl, dtype, kind):
    """bf16/f16 x: values and order are those of x's own values (exact in float32), lse too;
    "ints" ties at the k-th value, "zeros" mixes -0.0, 0.0 and -inf."""
    x = jnp.asarray(_draw(fresh_rng(), kind, 3, 37), dtype)
    x32 = np.asarray(x.astype(jnp.float32))
    values, indices, lse = topk_op.topk_logsumexp(x, 5, impl=impl)
    want_v, want_i = topk_reference(x32, 5)
    assert values.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(indices), want_i)
    np.testing.assert_array_equal(np.asarray(values), want_v)
    np.testing.assert_allclose(np.asarray(lse), logsumexp_reference(x32), rtol=1e-6, atol=1e-6)


@settings(max_examples=6, deadline=None)
@given(shape=st.sampled_from([c[:3] for c in CASES]), kind=st.sampled_from(["normal", "ints"]),
       seed=st.integers(0, 2**31 - 1))
def test_pallas_topk_property(shape, kind, seed):
    R, V, k = shape
    x = _draw(np.random.default_rng(seed), kind, R, V)
    values, indices = topk_op.topk(jnp.asarray(x), k, impl="pallas_triton")
    want_v, want_i = topk_reference(x, k)
    np.testing.assert_array_equal(np.asarray(indices), want_i)
    np.testing.assert_array_equal(np.asarray(values), want_v)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_shifted_keys_keep_order_and_distinctness(dtype):
    """keys(x widened to float32, key_shift(dtype)) compare exactly as the unshifted keys do
    (which order like the values, -0.0 == 0.0): over both signs, subnormals, extremes,
    infinities and ties."""
    from pallas_kernels.selection import key_shift, keys

    info = jnp.finfo(dtype)
    rng = fresh_rng()
    special = np.array([0.0, -0.0, np.inf, -np.inf, float(info.max), -float(info.max),
                        float(info.tiny), -float(info.tiny), float(info.smallest_subnormal),
                        -float(info.smallest_subnormal), 1.0, -1.0])
    x = jnp.asarray(np.concatenate([special, rng.normal(size=500) * 10,
                                    rng.integers(-3, 3, size=200)]), dtype).astype(jnp.float32)
    cmp = lambda a: (a[:, None] > a[None, :]).astype(int) - (a[:, None] < a[None, :])  # noqa: E731
    full = np.asarray(keys(x))
    assert np.array_equal(cmp(np.asarray(keys(x, key_shift(dtype)))), cmp(full))
    normal = np.abs(np.asarray(x)) >= float(info.tiny)     # the CPU flushes subnormals in compares
    assert np.array_equal(cmp(full[normal]), cmp(np.asarray(x)[normal]))


@pytest.mark.parametrize("k", [0, 9, 2.0, None])
def test_bad_k(k):
    with pytest.raises(ValueError, match="k must be"):
        topk_op.topk(jnp.zeros((2, 8)), k)


@pytest.mark.parametrize("x", [jnp.zeros((8,)), jnp.zeros((2, 2, 8)), jnp.zeros((2, 8), jnp.int32)])
def test_bad_x(x):
    with pytest.raises(ValueError, match="x must be"):
        topk_op.topk(x, 2)


def _superset_case(rng, kind, n):
    if kind == "normal":
        return rng.normal(size=n).astype(np.float32) * 3
    if kind == "wide":  # values over many binades, both signs, a -1e30 floor
        x = rng.choice([-1e30, -1e10, -3.0, 0.0, 1e-30, 2.5, 7e20], size=n)
        return (x * rng.uniform(0.5, 1.5, size=n)).astype(np.float32)
    if kind == "ties":
        return rng.integers(-2, 2, size=n).astype(np.float32)
    return np.where(rng.random(n) < 0.1, np.inf, rng.normal(size=n)).astype(np.float32)  # "inf"


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(["normal", "wide", "ties", "inf"]), n=st.sampled_from([7, 64, 300]),
       frac=st.floats(0.0, 1.0), seed=st.integers(0, 2**31 - 1))
def test_superset_is_a_prefix_of_the_order(kind, n, frac, seed):
    """`superset` (the bisection every Pallas selection uses) returns the first m entries in
    (value desc, position asc) order with k <= m <= cap, for values over any range."""
    from pallas_kernels.selection import in_superset, keys, superset

    rng = np.random.default_rng(seed)
    x = _superset_case(rng, kind, n)
    valid = rng.random(n) < 0.9
    k = max(1, int(frac * valid.sum()))
    cap = k + int(rng.integers(0, 4))
    key, pos = keys(jnp.asarray(x)), jnp.arange(n, dtype=jnp.int32)
    lo, cut, m = superset(key, jnp.asarray(valid), pos, k, cap)
    got = np.asarray(in_superset(key, jnp.asarray(valid), pos, lo, cut))
    order = sorted(np.flatnonzero(valid), key=lambda i: (-float(x[i]), i))
    assert int(m) == got.sum()
    if valid.sum() <= cap:
        assert got.sum() == valid.sum()
    else:
        assert k <= got.sum() <= cap
    assert set(np.flatnonzero(got)) == set(order[:got.sum()])


@pytest.mark.parametrize("cfg", [(1, 1, 64), (2, 2, 16384), (1, 2, 256), (2, 1, 256, 8, 32),
                                 (2, 1, 16, 0, 0, 512, 2)])
@pytest.mark.parametrize("kind", ["normal", "ints"])
def test_select_configs_are_exact(cfg, kind):
    """Every sizing of the top-k kernels (group cap, element cap, ranking tile, warps, group size,
    group-max chunk and warps) gives the exact top-k; rank_pairs 16 < 32 candidates walks the
    list in two tiles."""
    from pallas_kernels.topk.pallas_triton import SelectConfig, _topk

    x = _draw(fresh_rng(), kind, 2, 300)
    values, indices, lse = _topk(jnp.asarray(x), 20, True, SelectConfig(*cfg))
    want_v, want_i = topk_reference(x, 20)
    np.testing.assert_array_equal(np.asarray(indices), want_i)
    np.testing.assert_array_equal(np.asarray(values), want_v)


def test_small_vocabulary_sizes_are_picked_and_exact():
    """Where the default group step would keep every group (V = 2048, K = 64), the registered
    operation's sizes keep half the groups, and few rows stop the element step at 2 kp; both
    branches give the exact top-k, ties included."""
    from pallas_kernels.topk.pallas_triton import SelectConfig, _topk, select_config

    assert select_config(15, 163840, 64) == SelectConfig()
    assert select_config(15, 2048, 64) == SelectConfig(group_cap=1, elem_cap=2)
    assert select_config(240, 2048, 64) == SelectConfig(group_cap=1)
    for rows, kind in ((15, "ints"), (80, "normal")):
        x = _draw(fresh_rng(), kind, rows, 2048)
        values, indices, lse = _topk(jnp.asarray(x), 64, True)
        want_v, want_i = topk_reference(x, 64)
        np.testing.assert_array_equal(np.asarray(indices), want_i)
        np.testing.assert_array_equal(np.asarray(values), want_v)


@pytest.mark.parametrize("field, value", [("group_cap", 3), ("elem_cap", 0), ("rank_pairs", 100),
                                          ("warps", 6), ("group", 12), ("chunk", 3000),
                                          ("chunk_warps", 0)])
def test_bad_select_config_names_the_field(field, value):
    from pallas_kernels.topk.pallas_triton import SelectConfig, _topk

    with pytest.raises(ValueError, match=f"SelectConfig.{field}"):
        _topk(jnp.zeros((2, 64)), 4, True, SelectConfig()._replace(**{field: value}))
