"""experiments/k2_step_bench.py: the documented CPU smoke command, 1- and 2-way sharded."""

import json
import os
import subprocess
import sys

import pytest

from tests import ROOT


@pytest.mark.slow
def test_smoke_command_two_devices(tmp_path):
    """The documented CPU smoke command, 1- and 2-way sharded."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT,
               XLA_FLAGS="--xla_force_host_platform_device_count=2 --xla_backend_optimization_level=0")
    out = tmp_path / "smoke.json"
    proc = subprocess.run(
        [sys.executable, "experiments/k2_step_bench.py", "--preset=tiny", "--devices=1,2", "--budgets=4",
         "--streams=1,2", "--reps=2", f"--out={out}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    points = json.loads(out.read_text())["points"]
    assert sorted((p["devices"], p["streams"]) for p in points) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert proc.stdout.rstrip().splitlines()[-1].startswith("| 2 | 4 | 2 |")
