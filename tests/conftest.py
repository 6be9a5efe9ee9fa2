"""Test-wide settings: full-precision matmuls, the one Pallas:Triton warning filter."""

import os

# The suite is dominated by XLA:CPU compilation of small programs: LLVM at optimisation level 0, and
# emit fusions with XLA:CPU's older elemental emitter, which compiles faster than its MLIR fusion
# emitters (a cold run of three test files: 58 -> 38 s).
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false").strip()

import jax  # noqa: E402

import pallas_kernels.pallas_compat  # noqa: F401  (installs the one warning filter)

jax.config.update("jax_default_matmul_precision", "highest")

# Share compiled executables between the xdist workers (and across runs on one machine): most of
# the suite's time is XLA compilation of the same few jitted functions.
import tempfile  # noqa: E402

jax.config.update("jax_compilation_cache_dir", os.path.join(tempfile.gettempdir(), "ddtree_jax_xla_cache"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
