"""The test suite: framework/ (ddtree_jax), kernels/ (pallas_kernels), experiments/ (the entry
points), notebooks; shared helpers beside this file."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository

# XLA's CPU backend without LLVM's costly optimisations: compiles faster, runs slower (for a check
# whose time is compilation; tests/framework/test_sharding.py runs its checks so too).
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


def run_python(argv, xla_flags: str = "") -> subprocess.CompletedProcess:
    """`python argv...` from the repository root with it on PYTHONPATH (XLA_FLAGS extended): a
    script's command line, or a check in a fresh process (`-c code`; XLA reads XLA_FLAGS once)."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if xla_flags:
        env["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + xla_flags).strip()
    return subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def check_python(code: str, xla_flags: str = "") -> subprocess.CompletedProcess:
    """Run a check script (`python -c code`, run_python); it must exit 0 and print 'ok' last."""
    out = run_python(["-c", code], xla_flags)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]
    return out
