"""Test-wide settings: full-precision matmuls, the one Pallas:Triton warning filter."""

import jax

import pallas_kernels.pallas_compat  # noqa: F401  (installs the one warning filter)

jax.config.update("jax_default_matmul_precision", "highest")

# Share compiled executables between the xdist workers (and across runs on one machine): most of
# the suite's time is XLA compilation of the same few jitted functions.
import os  # noqa: E402
import tempfile  # noqa: E402

jax.config.update("jax_compilation_cache_dir", os.path.join(tempfile.gettempdir(), "ddtree_jax_xla_cache"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
