"""Test-wide settings: full-precision matmuls, the one Pallas:Triton warning filter."""

import jax

import pallas_kernels.pallas_compat  # noqa: F401  (installs the one warning filter)

jax.config.update("jax_default_matmul_precision", "highest")
