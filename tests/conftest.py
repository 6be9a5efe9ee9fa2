"""Test-wide settings: full-precision matmuls, the one Pallas:Triton warning filter."""

import os
import re
from importlib import metadata

# The suite is dominated by XLA:CPU compilation of small programs: LLVM at optimisation level 0, and
# (jaxlib < 0.11) fusions from XLA:CPU's older elemental emitter, which compiles faster than its MLIR
# fusion emitters (a cold run of three test files: 58 -> 38 s). jaxlib 0.11.2 no longer has that
# flag (its DebugOptions reserve the name) and XLA exits on an unknown one: only below jaxlib 0.11.
_JAXLIB = tuple(int(x) for x in re.match(r"(\d+)\.(\d+)", metadata.version("jaxlib")).groups())
_FLAGS = " --xla_backend_optimization_level=0" + (" --xla_cpu_use_fusion_emitters=false" if _JAXLIB < (0, 11) else "")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + _FLAGS).strip()

import jax  # noqa: E402

import pallas_kernels.pallas_compat  # noqa: F401  (installs the one warning filter)

jax.config.update("jax_default_matmul_precision", "highest")

# Share compiled executables between the xdist workers (and across runs on one machine): most of
# the suite's time is XLA compilation of the same few jitted functions.
import tempfile  # noqa: E402

jax.config.update("jax_compilation_cache_dir", os.path.join(tempfile.gettempdir(), "ddtree_jax_xla_cache"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
