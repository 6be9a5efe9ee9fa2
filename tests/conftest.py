"""Test-wide settings: full-precision matmuls, the one Pallas:Triton warning filter."""

import os
import re
from importlib import metadata

# The suite is dominated by XLA:CPU compilation of small programs: LLVM at optimisation level 0, and
# (jaxlib < 0.11) fusions from XLA:CPU's older elemental emitter, which compiles faster than its MLIR
# fusion emitters. jaxlib 0.11 and later lack that flag (their DebugOptions reserve the name) and
# XLA exits on an unknown one, so it is set only below jaxlib 0.11.
_JAXLIB = tuple(int(x) for x in re.match(r"(\d+)\.(\d+)", metadata.version("jaxlib")).groups())
_FLAGS = " --xla_backend_optimization_level=0" + (" --xla_cpu_use_fusion_emitters=false" if _JAXLIB < (0, 11) else "")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + _FLAGS).strip()
# pytest-xdist workers on one GPU (`pytest -m gpu -n 4`): each would otherwise reserve 75% of its
# memory at start. The GPU tests' compiles and float64 goldens are CPU-bound, so several workers
# share one GPU well.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402

import pallas_kernels.pallas_compat  # noqa: F401  (installs the one warning filter)

jax.config.update("jax_default_matmul_precision", "highest")

# Share compiled executables between the xdist workers (and across runs on one machine): most of
# the suite's time is XLA compilation of the same few jitted functions.
import tempfile  # noqa: E402

jax.config.update("jax_compilation_cache_dir", os.path.join(tempfile.gettempdir(), "ddtree_jax_xla_cache"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
