"""The kernel registry: "auto" per backend, the shape rules (choosers), and the fallback from an
implementation whose `supports` rule refuses a call; and the shared in-kernel product
`pallas_compat.dot_f32`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import registry
from tests.kernel_testing import assert_close, fresh_rng


def _fake_op(monkeypatch, chooser=None, supports=None):
    """Operation "test_op" whose implementations return their own names."""
    impls = {name: (lambda x, name=name: name) for name in ("xla", "pallas_triton", "mosaic_gpu")}
    monkeypatch.setitem(registry.OPERATIONS, "test_op", "pallas_kernels")
    monkeypatch.setitem(registry._REGISTRY, "test_op", impls)
    if chooser:
        monkeypatch.setitem(registry._CHOOSERS, "test_op", chooser)
    for impl, rule in (supports or {}).items():
        monkeypatch.setitem(registry._SUPPORTS, ("test_op", impl), rule)


def test_auto_dispatches_by_shape(monkeypatch):
    """On a GPU backend, get(op, "auto") for an operation with a chooser calls the implementation
    the chooser names for each call's arguments; off the GPU "auto" stays "xla"."""
    _fake_op(monkeypatch, chooser=lambda x: "mosaic_gpu" if x > 1 else "pallas_triton")
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    assert registry.get("test_op", "auto")(5) == "xla"
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    fn = registry.get("test_op", "auto")
    assert (fn(5), fn(0)) == ("mosaic_gpu", "pallas_triton")
    assert registry.get("test_op", "xla")(5) == "xla"              # a named impl bypasses the chooser


def test_auto_falls_back_where_an_implementation_refuses(monkeypatch):
    """The chooser's pick, else the GPU preference's first, unless its `supports` rule gives a
    reason: then the next of the preference that takes the call ("xla" takes every call)."""
    _fake_op(monkeypatch, chooser=lambda x: "mosaic_gpu",
             supports={"mosaic_gpu": lambda x: None if x < 10 else "x >= 10",
                       "pallas_triton": lambda x: None if x < 100 else "x >= 100"})
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    fn = registry.get("test_op", "auto")
    assert [fn(x) for x in (5, 50, 500)] == ["mosaic_gpu", "pallas_triton", "xla"]
    assert registry.get("test_op", "mosaic_gpu")(500) == "mosaic_gpu"   # named: the impl itself decides


def _bf16_experts(e, d, i):
    s = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16)   # noqa: E731
    return {"gate_kernel": s(e, d, i), "up_kernel": s(e, d, i), "down_kernel": s(e, i, d)}


def _s(*shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


@pytest.mark.parametrize("op,args,kwargs,want", [
    # mla_attention: the Pallas kernels need power-of-two v_dim and Dk - v_dim
    ("mla_attention", (_s(1, 2, 4, 64), _s(1, 8, 64), _s(1, dtype=jnp.int32), _s(1, 2, 1, dtype=jnp.int32)),
     dict(scale=0.1, v_dim=32), "pallas_triton"),
    ("mla_attention", (_s(1, 2, 4, 64), _s(1, 8, 64), _s(1, dtype=jnp.int32), _s(1, 2, 1, dtype=jnp.int32)),
     dict(scale=0.1, v_dim=48), "xla"),
    # drafter_attention and drafter_qkv: power-of-two head_dim (halves)
    ("drafter_attention", (_s(1, 4, 2, 48), _s(1, 1, 8, 48), _s(1, 1, 8, 48), _s(1, dtype=jnp.int32),
                           _s(1, 4, 1, 48), _s(1, 4, 1, 48)), dict(scale=0.1), "xla"),
    ("drafter_attention", (_s(1, 4, 2, 32), _s(1, 1, 8, 32), _s(1, 1, 8, 32), _s(1, dtype=jnp.int32),
                           _s(1, 4, 1, 32), _s(1, 4, 1, 32)), dict(scale=0.1), "pallas_triton"),
    ("drafter_qkv", (_s(1, 4, 32), _s(1, 4, dtype=jnp.int32), None, _s(32, 48), _s(32, 48), None, _s(48),
                     _s(24)), dict(norm=None, eps=1e-6), "xla"),
    ("drafter_qkv", (_s(1, 4, 32), _s(1, 4, dtype=jnp.int32), None, _s(32, 64), _s(32, 64), None, _s(64),
                     _s(32)), dict(norm=None, eps=1e-6), "pallas_triton"),
    # moe_experts with bf16 experts: Pallas needs d and I multiples of 16
    ("moe_experts", (_s(3, 40), _s(3, 2, dtype=jnp.int32), _s(3, 2), _bf16_experts(4, 40, 32)), {}, "xla"),
    ("moe_experts", (_s(3, 48), _s(3, 2, dtype=jnp.int32), _s(3, 2), _bf16_experts(4, 48, 32)), {},
     "pallas_triton"),
])
def test_auto_never_picks_an_implementation_that_refuses(monkeypatch, op, args, kwargs, want):
    """On a GPU, impl="auto" takes "xla" for shapes the kernels refuse (as "xla" itself does)."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert registry.auto_impl(op, *args, **kwargs) == want


@pytest.mark.parametrize("have_jax_triton,d,want", [(True, 64, "triton"), (False, 64, "pallas_triton"),
                                                    (True, 48, "pallas_triton")])
def test_auto_moe_takes_triton_where_jax_triton_is(monkeypatch, have_jax_triton, d, want):
    """On a GPU, impl="auto" for moe_experts takes the raw Triton kernels when jax-triton imports
    and their shape rule (bf16 experts: d, I multiples of 32) takes the call, else "pallas_triton"."""
    from pallas_kernels.moe import triton_impl
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(triton_impl, "have_jax_triton", lambda: have_jax_triton)
    args = (_s(3, d), _s(3, 2, dtype=jnp.int32), _s(3, 2), _bf16_experts(4, d, 32))
    assert registry.auto_impl("moe_experts", *args) == want
    if not have_jax_triton:
        with pytest.raises(ValueError, match="jax-triton is not installed"):
            triton_impl.moe_experts_triton(jnp.zeros((3, d), jnp.bfloat16), jnp.zeros((3, 2), jnp.int32),
                                           jnp.zeros((3, 2)), {k: jnp.zeros(v.shape, v.dtype)
                                                                for k, v in _bf16_experts(4, d, 32).items()})


@pytest.mark.parametrize("k", [8, 16])
@pytest.mark.parametrize("contract_b", [1, 0])
def test_dot_f32_is_exact_for_small_k(k, contract_b):
    """pallas_compat.dot_f32: bf16 operands with K < 16 (the broadcast product) and K = 16 (the
    dot) both give the float64 product of the bf16 values to float32 rounding."""
    from pallas_kernels.pallas_compat import dot_f32
    rng = fresh_rng()
    a = jnp.asarray(rng.standard_normal((32, k)), jnp.bfloat16)
    b = jnp.asarray(rng.standard_normal((64, k) if contract_b else (k, 64)), jnp.bfloat16)
    got = dot_f32(a, b, contract_b)
    b64 = np.asarray(b, np.float64)
    want = np.asarray(a, np.float64) @ (b64.T if contract_b else b64)
    assert got.dtype == jnp.float32 and got.shape == (32, 64)
    assert_close(got, want, 1e-6, f"K={k}")


def test_assert_close_logs_error_over_tolerance(monkeypatch, tmp_path):
    """DDTREE_TOL_LOG: each check appends (test, what, error, tol, error / tol); a failing check
    is logged and still fails."""
    log = tmp_path / "tol.tsv"
    monkeypatch.setenv("DDTREE_TOL_LOG", str(log))
    ref = np.array([3.0, 4.0])
    assert_close(ref + np.array([0.0, 0.01]), ref, 1e-2, "small")        # error 2e-3
    with pytest.raises(AssertionError, match="big: relative error 2.000e-01"):
        assert_close(ref + np.array([0.0, 1.0]), ref, 1e-2, "big")
    rows = [line.split("\t") for line in log.read_text().splitlines()]
    assert [r[1:] for r in rows] == [["small", "2.000e-03", "1.0e-02", "0.200"],
                                     ["big", "2.000e-01", "1.0e-02", "20.000"]]
    assert rows[0][0].startswith("tests/kernels/test_registry.py::test_assert_close_logs_error_over_tolerance")


def test_every_operation_is_in_the_table_with_an_entry_point_and_an_xla_path():
    """registry.OPERATIONS lists every registered operation; each has the validated entry point
    named after it in its package and the "xla" reference path; an operation outside the table
    cannot be registered."""
    import importlib
    from pallas_kernels import registry
    registry.implementations("moe_experts")       # loads every package
    assert set(registry._REGISTRY) == set(registry.OPERATIONS)
    for op, package in registry.OPERATIONS.items():
        assert callable(getattr(importlib.import_module(package), op)), op
        assert "xla" in registry.implementations(op), op
    with pytest.raises(ValueError, match="registry.OPERATIONS"):
        registry.register("no_such_op", "xla")
