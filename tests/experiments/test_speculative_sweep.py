"""experiments/speculative_sweep.py: the default config, resume after a kill, and every sweep config
naming its own command."""

import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests import ROOT
from tests.sweep_testing import load_config, load_module, overrides


def test_default_config_uses_the_shipped_pair_when_present():
    cfg = load_config("sweep_default")
    shipped = os.path.isdir(cfg.target_dir) and os.path.isdir(cfg.drafter_dir)
    assert cfg.random_tiny == (not shipped)
    assert cfg.target_dir == os.path.join(ROOT, "assets/pair/target")


def test_sweep_resumes_after_kill(tmp_path):
    """Kill the sweep (SIGKILL) once its first point is on disk, tear the file's tail, rerun: every
    point is there exactly once, the first one was not redone, and the torn line is kept (and
    reported) on a line of its own."""
    out = tmp_path / "sweep"
    results = out / "results.jsonl"
    cmd = [sys.executable, os.path.join(ROOT, "experiments/speculative_sweep.py"),
           "--config=" + os.path.join(ROOT, "configs/sweep_default.py")]
    fields = overrides(out, tmp_path / "cache", methods=("ar",), streams=(1, 2))
    cmd += [f"--config.{k}={v}" for k, v in fields.items()]
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while not (results.exists() and results.read_text().count("\n") >= 1):
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    first = results.read_text().splitlines()
    with open(results, "a") as f:
        f.write('{"key": "torn')
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = results.read_text().splitlines()
    assert lines[len(first)] == '{"key": "torn' and "torn: no end of line" in done.stderr
    recs = [json.loads(line) for i, line in enumerate(lines) if i != len(first)]
    assert len({r["key"] for r in recs}) == len(recs) == 2
    assert lines[:len(first)] == first
    assert [(r["method"], r["streams"]) for r in recs] == [("ar", 1), ("ar", 2)]
    assert all(r["speedup"] == 1 and r["tau"] == 1 for r in recs)
    assert "| 0 | 2 | ar |" in done.stdout and (out / "sweep_T0.png").exists()


@pytest.mark.parametrize("name", [os.path.basename(p)[:-3] for p in
                                  sorted(glob.glob(os.path.join(ROOT, "configs", "sweep_*.py")))])
def test_sweep_configs_hold_their_command(name):
    mod = load_module(name)
    assert f"experiments/speculative_sweep.py --config=configs/{name}.py" in mod.__doc__
    cfg = mod.get_config()
    assert cfg.methods and cfg.streams and cfg.temperatures and cfg.out_dir
