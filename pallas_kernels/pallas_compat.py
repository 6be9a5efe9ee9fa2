"""The one place that imports Pallas:Triton and decides interpret mode.

JAX 0.11 deprecates the Pallas:Triton backend and warns on every use. It is still the only Pallas
GPU backend that runs on both JAX 0.10 and 0.11 and lowers the INT4 and attention kernels, so the
warning is silenced here, once. The raw-Triton implementations (jax-triton) do not depend on it.
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

# Kernels keep scores in log2 units (scale * LOG2E) and exponentiate with jnp.exp2, the hardware
# ex2 (about 2 ulp): float32 jnp.exp lowers to libdevice's exactly rounded __nv_expf, which costs
# registers and makes large score tiles spill (docs/kernels/mla_attention.md).
LOG2E = math.log2(math.e)

MIN_DOT_K = 16      # the smallest K of a 16-bit tensor-core product


def dot_f32(a, b, contract_b: int):
    """a [M, K] @ b (contract_b=1: b is [N, K]; 0: b is [K, N]) -> float32 [M, N], inside a kernel.

    16-bit operands with K below MIN_DOT_K are multiplied as an exact float32
    broadcast-multiply-sum, in either contraction: Triton's 16-bit dot with K = 8 computes wrong
    results on Hopper (docs/kernels/mla_attention.md). Pallas:Triton cannot pad K instead: it
    concatenates only [..., 1] pieces."""
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
