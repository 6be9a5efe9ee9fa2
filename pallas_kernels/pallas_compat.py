"""The one place that imports Pallas:Triton and decides interpret mode.

JAX 0.11 deprecates the Pallas:Triton backend (in favour of Mosaic GPU) and warns on use. We keep
it because it is the only Pallas GPU backend that runs on both JAX 0.10 and 0.11 and lowers our
INT4 and attention kernels; the warning is silenced here, once, so it does not drown test and
benchmark output. The raw-Triton implementations (jax-triton) are the route that survives the
backend's removal.
"""

from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp

warnings.filterwarnings("ignore", message=r".*[Tt]riton.*deprecat.*")
warnings.filterwarnings("ignore", message=r".*deprecat.*[Tt]riton.*")

from jax.experimental import pallas as pl  # noqa: E402
from jax.experimental.pallas import triton as plgpu  # noqa: E402

__all__ = ["pl", "plgpu", "interpret_mode", "on_gpu", "LOG2E", "MIN_DOT_K", "dot_f32"]

# Kernels exponentiate with jnp.exp2, keeping scores in log2 units (scale * LOG2E): float32 jnp.exp
# lowers to libdevice's __nv_expf, an exactly rounded routine that held a 128x128 scores tile at
# 128 registers instead of 96 (and made 128x256 spill) in offline sm_90a compiles, where
# __nv_exp2f is the hardware ex2 (about 2 ulp).
LOG2E = math.log2(math.e)

MIN_DOT_K = 16      # the smallest K of a 16-bit tensor-core product


def dot_f32(a, b, contract_b: int):
    """a [M, K] @ b (contract_b=1: b is [N, K]; 0: b is [K, N]) -> float32 [M, N], inside a kernel.
    16-bit operands with K below MIN_DOT_K are multiplied as a float32 broadcast-multiply-sum
    (exact): on the H200, Triton's 16-bit dot with K = 8 (an MLA rope width of 8, contract_b=1)
    gave wrong results (rel err 0.25-0.53 at every tested shape, BENCHMARKS.md issue 5, session
    24) where interpret mode was right; float32 with K = 8 was right. contract_b=0 with K < 16 was
    not probed and takes the same exact path. Pallas:Triton cannot pad K instead: it concatenates
    only [..., 1] pieces."""
    if a.shape[1] < MIN_DOT_K and a.dtype.itemsize == 2:
        a, b = a.astype(jnp.float32), b.astype(jnp.float32)
        if contract_b:
            return (a[:, None, :] * b[None, :, :]).sum(axis=2)                       # [M, N, K]
        return (a[:, :, None] * b[None, :, :]).sum(axis=1)                            # [M, K, N]
    return jax.lax.dot_general(a, b, (((1,), (contract_b,)), ((), ())), preferred_element_type=jnp.float32)


def on_gpu() -> bool:
    return jax.default_backend() == "gpu"


def interpret_mode() -> bool:
    """Pallas kernels run compiled on a GPU and in interpret mode everywhere else."""
    return not on_gpu()
