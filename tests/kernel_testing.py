"""Shared base for kernel tests: every implementation of an operation against its numpy golden."""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

from pallas_kernels import registry
from pallas_kernels.mla_attention.mosaic_gpu import is_hopper


def runnable_impls(op: str) -> list:
    """pytest params for every registered implementation of `op`; GPU-only ones carry the `gpu`
    marker and skip off the GPU."""
    out = []
    for impl in registry.implementations(op):
        marks = [pytest.mark.gpu] if impl in ("triton", "mosaic_gpu") else []
        if impl == "triton" and jax.default_backend() != "gpu":
            marks.append(pytest.mark.skip(reason="raw Triton (jax-triton) needs a GPU"))
        if impl == "mosaic_gpu" and not is_hopper():
            marks.append(pytest.mark.skip(reason="Pallas Mosaic GPU kernels need a Hopper GPU"))
        out.append(pytest.param(impl, id=impl, marks=marks))
    return out


def fresh_rng() -> np.random.Generator:
    """Fresh random inputs every run: the seed is printed (pytest shows it with a failure) and
    DDTREE_TEST_SEED=<seed> replays it."""
    seed = int(os.environ.get("DDTREE_TEST_SEED") or np.random.SeedSequence().entropy % 2**32)
    print(f"seed={seed}")
    return np.random.default_rng(seed)


def rel_err(out, ref) -> float:
    """||out - ref|| / ||ref|| in float64; NaN anywhere in `out` gives inf."""
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    if not np.all(np.isfinite(out)):
        return float("inf")
    den = np.linalg.norm(ref)
    return float(np.linalg.norm(out - ref) / (den if den > 0 else 1.0))


def assert_close(out, ref, tol: float, what: str = "output") -> None:
    """rel_err(out, ref) <= tol. With DDTREE_TOL_LOG=<file>, each check also appends a line (test,
    what, error, tol, error / tol): run the fresh-seed tests a few times and sort by the last
    column to find a bound near its error's tail (such a bound fails CI on some fresh seed)."""
    err = rel_err(out, ref)
    if log := os.environ.get("DDTREE_TOL_LOG"):
        with open(log, "a") as f:
            f.write(f"{os.environ.get('PYTEST_CURRENT_TEST', '?')}\t{what}\t{err:.3e}\t{tol:.1e}\t{err / tol:.3f}\n")
    assert err <= tol, f"{what}: relative error {err:.3e} > {tol:.1e}"
