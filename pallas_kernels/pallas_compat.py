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

warnings.filterwarnings("ignore", message=r".*[Tt]riton.*deprecat.*")
warnings.filterwarnings("ignore", message=r".*deprecat.*[Tt]riton.*")

from jax.experimental import pallas as pl  # noqa: E402
from jax.experimental.pallas import triton as plgpu  # noqa: E402

__all__ = ["pl", "plgpu", "interpret_mode", "on_gpu", "LOG2E"]

# Kernels exponentiate with jnp.exp2, keeping scores in log2 units (scale * LOG2E): float32 jnp.exp
# lowers to libdevice's __nv_expf, an exactly rounded routine that held a 128x128 scores tile at
# 128 registers instead of 96 (and made 128x256 spill) in offline sm_90a compiles, where
# __nv_exp2f is the hardware ex2 (about 2 ulp).
LOG2E = math.log2(math.e)


def on_gpu() -> bool:
    return jax.default_backend() == "gpu"


def interpret_mode() -> bool:
    """Pallas kernels run compiled on a GPU and in interpret mode everywhere else."""
    return not on_gpu()
