"""The speculative sweep (experiments/speculative_sweep.py, ddtree_jax/bench/sweep.py): crash-safe results
log, grid, resume after a kill, the default config."""

import dataclasses
import glob
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import jax
import pytest

from ddtree_jax import engine
from ddtree_jax.bench import parity, sweep, sweep_io
from tests import ROOT



def _rec(i, **kw):
    p = dict(pair="p", method="ddtree", budget=2 ** i, streams=1, temperature=0.0)
    return dict(p, key=sweep_io.point_key(p), tau=1.5, tokens_per_second=10.0 * i, speedup=None,
                steps=3, stage_times={"step": 1e-3, "verify": 5e-4}, **kw)


def test_stage_columns_are_the_engines_named_scopes():
    from ddtree_jax.bench import timing
    assert sweep_io.STAGES is timing.STAGES == ("draft", "tree", "verify", "accept")


def test_results_log_survives_a_torn_line(tmp_path):
    path = str(tmp_path / "r.jsonl")
    log = sweep_io.ResultsLog(path)
    log.append(_rec(1))
    log.append(_rec(2))
    with pytest.raises(ValueError):
        log.append(_rec(1))
    with open(path, "a") as f:
        f.write('{"key": "half a record')                 # killed mid-write
    before = open(path, "rb").read()
    with pytest.warns(UserWarning, match=r"r.jsonl: .*line 3: torn"):
        again = sweep_io.ResultsLog(path)
    assert open(path, "rb").read() == before               # reading never modifies the file
    assert list(again.records) == [_rec(1)["key"], _rec(2)["key"]] and again.damaged[0][0] == 3
    again.append(_rec(3))
    with open(path) as f:
        lines = f.read().splitlines()
    assert lines[2] == '{"key": "half a record' and [json.loads(lines[i])["budget"] for i in (0, 1, 3)] == [2, 4, 8]
    with pytest.warns(UserWarning, match="line 3"):
        assert list(sweep_io.ResultsLog(path).records) == [_rec(i)["key"] for i in (1, 2, 3)]


@pytest.mark.parametrize("bad", ['not json at all', '{"budget": 4}', '[1, 2]', '{"key": 7}'])
def test_a_damaged_middle_line_is_reported_and_the_records_around_it_kept(tmp_path, bad):
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join([json.dumps(_rec(1)), bad, json.dumps(_rec(2))]) + "\n")
    before = path.read_bytes()
    with pytest.warns(UserWarning, match=r"r.jsonl: skipped damaged line\(s\) line 2: not a record"):
        log = sweep_io.ResultsLog(str(path))
    assert list(log.records) == [_rec(1)["key"], _rec(2)["key"]] and log.damaged[0][0] == 2
    assert path.read_bytes() == before
    with pytest.warns(UserWarning, match="line 2"):
        assert len(sweep_io.read_results(str(path))) == 2


def test_summary_and_plot(tmp_path, monkeypatch, capsys):
    recs = [_rec(1), _rec(2), dict(_rec(3), method="ar", budget=None, speedup=1.0)]
    table = sweep_io.summary_table(recs)
    assert table.count("\n") == 4 and "| ar |" in table.splitlines()[2]
    assert "requests" not in table
    png = tmp_path / "p.png"
    sweep_io.plot_sweep(recs, str(png), 0.0)
    assert png.stat().st_size > 1000
    monkeypatch.setitem(sys.modules, "matplotlib", None)      # no [plots] extra: a note, no error
    sweep_io.plot_sweep(recs, str(tmp_path / "q.png"), 0.0)
    assert "q.png not written" in capsys.readouterr().out and not (tmp_path / "q.png").exists()
    served = sweep_io.summary_table(recs[:2] + [dict(_rec(4), requests=8, request_p50_s=0.25,
                                                     request_tokens_per_second=12.5, device_steps=4)])
    lines = served.splitlines()
    assert lines[0].endswith("| requests | request p50 s | request tok/s |")
    assert lines[-1].endswith("| 3 | 4 | 8 | 0.250 | 12.5 |")
    assert lines[2].endswith("| 3 |  |  |  |  |")
    assert all(line.count("|") == lines[0].count("|") for line in lines)


def _load_config(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "configs", name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.get_config()


def test_default_config_uses_the_shipped_pair_when_present():
    cfg = _load_config("sweep_default")
    shipped = os.path.isdir(cfg.target_dir) and os.path.isdir(cfg.drafter_dir)
    assert cfg.random_tiny == (not shipped)
    assert cfg.target_dir == os.path.join(ROOT, "assets/pair/target")


def _overrides(out, cache, **kw):
    c = dict(random_tiny=True, random_vocab=16, block_size=3, prompt_len=5, methods=("ar", "ddtree"),
             budgets=(2,), streams=(1,), max_new_tokens=3, stage_reps=0, auto_steps=1,
             out_dir=str(out), compile_cache=str(cache))
    c.update(kw)
    return c


def test_sweep_resumes_after_kill(tmp_path):
    """Kill the sweep (SIGKILL) once its first point is on disk, tear the file's tail, rerun: every
    point is there exactly once, the first one was not redone, and the torn line is kept (and
    reported) on a line of its own."""
    out = tmp_path / "sweep"
    results = out / "results.jsonl"
    cmd = [sys.executable, os.path.join(ROOT, "experiments/speculative_sweep.py"),
           "--config=" + os.path.join(ROOT, "configs/sweep_default.py")]
    overrides = _overrides(out, tmp_path / "cache", methods=("ar",), streams=(1, 2))
    cmd += [f"--config.{k}={v}" for k, v in overrides.items()]
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


def test_auto_point_uses_the_groups_step_times(tmp_path):
    """ddtree-auto takes t(b) from the finished fixed-budget points and picks a budget within them."""
    cfg = _load_config("sweep_default")
    cfg.update(_overrides(str(tmp_path), "", methods=("ar", "ddtree", "ddtree-auto"), budgets=(2, 4)))
    target, drafter, prompts, pair = sweep.load_pair(cfg)
    points = sweep.grid(cfg, pair)
    assert [p["method"] for p in points] == ["ar", "ddtree", "ddtree", "ddtree-auto"]
    log = sweep_io.ResultsLog(str(tmp_path / "r.jsonl"))
    log.append(dict(sweep.run_point(target, drafter, prompts, points[0], log, cfg),
                    stage_times={"step": 1e-3}))
    for p, step in zip(points[1:3], (2e-3, 2.5e-3)):
        log.append(dict(p, key=sweep_io.point_key(p), tokens_per_second=100.0, stage_times={"step": step}))
    rec = sweep.run_point(target, drafter, prompts, points[3], log, cfg)
    assert rec["curve_budgets"] == [2, 4] and rec["curve_seconds"] == [2e-3, 2.5e-3]
    assert 1 <= rec["budget"] <= 4 and rec["expected_tau"] >= 1 and rec["speedup"] > 0
    assert rec["key"] == sweep_io.point_key(points[3])


def test_ar_baseline_runs_at_its_own_steps_per_call(tmp_path):
    """ar_steps_per_call gives the baseline its own dispatch setting, and speedups divide by it."""
    cfg = _load_config("sweep_default")
    cfg.update(_overrides(str(tmp_path), "", methods=("ar", "ddtree"), budgets=(2,)))
    cfg.steps_per_call, cfg.ar_steps_per_call = 2, 3
    target, drafter, prompts, pair = sweep.load_pair(cfg)
    points = sweep.grid(cfg, pair)
    assert [(p["method"], p["steps_per_call"]) for p in points] == [("ar", 3), ("ddtree", 2)]
    log = sweep_io.ResultsLog(str(tmp_path / "r.jsonl"))
    log.append(dict(sweep.run_point(target, drafter, prompts, points[0], log, cfg), tokens_per_second=1.0))
    rec = sweep.run_point(target, drafter, prompts, points[1], log, cfg)
    assert rec["speedup"] == pytest.approx(rec["tokens_per_second"]) and rec["greedy_ties"] == 0
    assert rec["loop"] == "device"   # "auto": the speculative methods' decode runs on the device
    assert "| ddtree | 2 | 2 device |" in sweep_io.summary_table([rec])
    assert _load_config("sweep_h200").ar_steps_per_call == 8


@pytest.mark.parametrize("name", [os.path.basename(p)[:-3] for p in
                                  sorted(glob.glob(os.path.join(ROOT, "configs", "sweep_*.py")))])
def test_sweep_configs_hold_their_command(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "configs", name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert f"experiments/speculative_sweep.py --config=configs/{name}.py" in mod.__doc__
    cfg = mod.get_config()
    assert cfg.methods and cfg.streams and cfg.temperatures and cfg.out_dir


def test_served_point_runs_every_request_through_the_slots(tmp_path):
    """requests > 0: the point serves that many requests (prompts cycled) through `streams` slots,
    with the same tau and tokens as the static batches would give at temperature 0."""
    cfg = _load_config("sweep_default")
    cfg.update(_overrides(str(tmp_path), "", methods=("ddtree",), streams=(2,), requests=5,
                          max_new_tokens=4))
    target, drafter, prompts, pair = sweep.load_pair(cfg)
    points = sweep.grid(cfg, pair)
    assert [(p["method"], p["requests"]) for p in points] == [("ar", 5), ("ddtree", 5)]
    log = sweep_io.ResultsLog(str(tmp_path / "r.jsonl"))
    log.append(sweep.run_point(target, drafter, prompts, points[0], log, cfg))
    assert len(log.records[sweep_io.point_key(points[0])]["tokens"][0]) == 5
    rec = sweep.run_point(target, drafter, prompts, points[1], log, cfg)
    assert rec["generated"] == 5 * 3 and rec["steps"] >= 3 and rec["tau"] >= 1
    assert rec["greedy_ties"] == 0 and "tokens" not in rec
    assert 0 < rec["request_p50_s"] <= rec["request_p90_s"] <= rec["decode_seconds"]
    assert rec["request_tokens_per_second"] > 0
    static = engine.generate(target, drafter, [prompts[i % len(prompts)] for i in range(5)],
                             method="ddtree", budget=2, max_new_tokens=4, stage_reps=0)
    assert rec["tau"] == pytest.approx(static.tau)


def test_xla_flags_need_a_backend_not_yet_started(monkeypatch):
    """XLA reads XLA_FLAGS once, when the backend starts: config.xla_flags is appended before
    that, and refused (not silently ignored) after."""
    jax.devices()                                     # the backend has started
    with pytest.raises(ValueError, match="config.xla_flags"):
        sweep.add_xla_flags("--xla_dump_to=/tmp/x")
    monkeypatch.setattr(sweep.xla_bridge, "backends_are_initialized", lambda: False)
    monkeypatch.setenv("XLA_FLAGS", "--a=1")
    sweep.add_xla_flags("--b=2")
    assert os.environ["XLA_FLAGS"] == "--a=1 --b=2"


def test_points_are_keyed_by_backend_and_device_kind(tmp_path):
    """A results file from another machine is not resumed from: the JAX backend and the device
    kind are part of every point's key (and record)."""
    cfg = _load_config("sweep_default")
    cfg.update(_overrides(str(tmp_path), ""))
    points = sweep.grid(cfg, "p")
    assert all(p["backend"] == jax.default_backend() and p["device_kind"] == jax.devices()[0].device_kind
               for p in points)
    log = sweep_io.ResultsLog(str(tmp_path / "r.jsonl"))
    elsewhere = dict(points[0], backend="gpu", device_kind="NVIDIA H200")
    log.append(dict(elsewhere, key=sweep_io.point_key(elsewhere), tokens_per_second=1.0))
    assert sweep_io.point_key(points[0]) not in log


def test_served_points_refuse_static_timing_settings(tmp_path):
    """serving.serve decodes once with its own loop: timing_reps / decode_loop other than 1 /
    "auto" with requests > 0 are an error, not recorded and ignored."""
    cfg = _load_config("sweep_default")
    cfg.update(_overrides(str(tmp_path), "", requests=4))
    for field, value in (("timing_reps", 3), ("decode_loop", "device")):
        bad = cfg.copy_and_resolve_references()
        bad[field] = value
        with pytest.raises(ValueError, match=f"config.{field}="):
            sweep.grid(bad, "p")
    assert [p["timing_reps"] for p in sweep.grid(_load_config("serve_h200"), "p")][:1] == [1]


def test_a_point_that_is_not_lossless_is_refused(tmp_path, monkeypatch):
    """At temperature 0 a speculative point's tokens must be ar's, taken from ar's record (as in a
    resumed run), before its numbers are recorded: one changed token is an error naming the point,
    the stream and the position."""
    cfg = _load_config("sweep_default")
    cfg.update(_overrides(str(tmp_path), "", streams=(2,)))
    target, drafter, prompts, pair = sweep.load_pair(cfg)
    points = sweep.grid(cfg, pair)
    log = sweep_io.ResultsLog(str(tmp_path / "r.jsonl"))
    log.append(sweep.run_point(target, drafter, prompts, points[0], log, cfg))
    generate = engine.generate

    def one_token_off(*args, **kw):
        r = generate(*args, **kw)
        tokens = [list(t) for t in r.tokens]
        tokens[1][1] = (tokens[1][1] + 1) % cfg.random_vocab
        return dataclasses.replace(r, tokens=tokens)

    monkeypatch.setattr(engine, "generate", one_token_off)
    with pytest.raises(AssertionError, match=r"ddtree@2 at 2 streams, batch 0: stream 1 emits token "
                                             r"\d+ at position 1 where ar emits"):
        sweep.run_point(target, drafter, prompts, points[1], sweep_io.ResultsLog(log.path), cfg)
    monkeypatch.setattr(parity, "TIE_REL", 2.0)       # every difference within a "near-tie"
    assert sweep.run_point(target, drafter, prompts, points[1], log, cfg)["greedy_ties"] == 1


@pytest.mark.parametrize("field, value, words", [
    ("methods", ("ar", "ddtre"), r"config.methods must name methods from .*\['ddtre'\]"),
    ("methods", (), "config.methods must name methods"),
    ("streams", (0,), r"config.streams must be a non-empty list of ints >= 1; got \(0,\)"),
    ("streams", (), "config.streams must be a non-empty list"),
    ("budgets", (4, "8"), "config.budgets must be a non-empty list of ints"),
    ("temperatures", (-0.5,), "config.temperatures must be a non-empty list of numbers >= 0"),
    ("max_new_tokens", 0, "config.max_new_tokens must be an int >= 1"),
    ("batches", 0, "config.batches must be an int >= 1"),
])
def test_a_sweep_config_the_sweep_cannot_run_is_refused_by_field(field, value, words):
    cfg = _load_config("sweep_default")
    cfg[field] = value
    with pytest.raises(ValueError, match=words):
        sweep.grid(cfg, "pair")
