"""The sweep's points (ddtree_jax/bench/sweep.py): the grid, ddtree-auto, the ar baseline, served
points, losslessness before any number is recorded, and configs it cannot run refused by field."""

import dataclasses
import os

import jax
import numpy as np
import pytest

from ddtree_jax import engine
from ddtree_jax.bench import auto_budget, parity, sweep, sweep_io
from tests.sweep_testing import load_config, overrides


def test_auto_point_uses_the_groups_step_times(tmp_path):
    """ddtree-auto takes t(b) from the finished fixed-budget points and picks a budget within them."""
    cfg = load_config("sweep_default")
    cfg.update(overrides(str(tmp_path), "", methods=("ar", "ddtree", "ddtree-auto"), budgets=(2, 4)))
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


def test_shared_points_against_their_uniform_splits(tmp_path):
    """shared_budgets N: a ddtree-shared point per N (cap shared_cap), the uniform split N / streams
    as a ddtree point where it divides (once, beside the budgets), and ddtree-shared-auto; other
    points keep their keys (no shared_budget field). A shared point records its verified-node
    accounting: no step above N nodes or a stream above the cap, the totals consistent with tau;
    the auto point takes its curve from the shared points' step times (or measures one over the
    shared totals)."""
    cfg = load_config("sweep_default")
    cfg.update(overrides(str(tmp_path), "", methods=("ar", "ddtree", "ddtree-shared", "ddtree-shared-auto"),
                          budgets=(2,), streams=(2,), shared_budgets=(3, 4), shared_cap=3, max_new_tokens=4))
    target, drafter, prompts, pair = sweep.load_pair(cfg)
    points = sweep.grid(cfg, pair)
    assert [(p["method"], p["budget"], p.get("shared_budget")) for p in points] == [
        ("ar", None, None), ("ddtree", 2, None), ("ddtree-shared", 3, 3), ("ddtree-shared", 3, 4),
        ("ddtree-shared-auto", 3, None)]
    assert all("shared_budget" not in p for p in points if p["method"] in ("ar", "ddtree"))
    log = sweep_io.ResultsLog(str(tmp_path / "r.jsonl"))
    for p in points[:4]:
        log.append(sweep.run_point(target, drafter, prompts, p, log, cfg))
    for p in points[1:4]:
        rec = log.records[sweep_io.point_key(p)]
        n, cap = p.get("shared_budget") or 2 * p["budget"], p["budget"]
        steps = [col for batch in rec["tree_nodes"] for col in sweep_io._steps(batch)]
        assert len(steps) == rec["steps"] and all(sum(c) <= n and max(c) <= cap for c in steps)
        verified = sum(len(c) + sum(c) for c in steps)
        assert rec["tokens_per_verified"] == pytest.approx(rec["tokens_per_step"] * rec["steps"] / verified)
        full = [sum(c) for batch in rec["acceptance_lengths"] for c in sweep_io._steps(batch)
                if len(c) == len(batch)]
        assert rec["tokens_per_full_step"] == pytest.approx(np.mean(full))
        assert rec["greedy_ties"] == 0 and len(rec["tau_per_stream"][0]) == 2
    for p, step in zip(points[2:4], (2e-3, 3e-3)):      # the auto point's curve comes from these
        key = sweep_io.point_key(p)
        log.records[key] = dict(log.records[key], stage_times={"step": step})
    auto = sweep.run_point(target, drafter, prompts, points[4], log, cfg)
    assert auto["curve_budgets"] == [3, 4] and auto["curve_seconds"] == [2e-3, 3e-3]
    measured = auto_budget.measure_step_times(target, drafter, prompts[:2], (4, 2), shared_cap=3,
                                              max_new_tokens=4, reps=1)
    assert measured.budgets == (2, 4) and min(measured.seconds) > 0
    assert all(sum(c) <= 4 for batch in auto["tree_nodes"] for c in sweep_io._steps(batch))
    table = sweep_io.summary_table(list(log.records.values()) + [auto])
    assert "| ddtree-shared | 4/3 |" in table and "| ddtree-shared-auto | auto/3 |" in table
    sweep_io.plot_shared(list(log.records.values()) + [auto], str(tmp_path / "s.png"), 0.0)
    assert (tmp_path / "s.png").stat().st_size > 1000


def test_ar_baseline_runs_at_its_own_steps_per_call(tmp_path):
    """ar_steps_per_call gives the baseline its own dispatch setting, and speedups divide by it."""
    cfg = load_config("sweep_default")
    cfg.update(overrides(str(tmp_path), "", methods=("ar", "ddtree"), budgets=(2,)))
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
    assert load_config("sweep_h200").ar_steps_per_call == 8


def test_served_point_runs_every_request_through_the_slots(tmp_path):
    """requests > 0: the point serves that many requests (prompts cycled) through `streams` slots,
    with the same tau and tokens as the static batches would give at temperature 0."""
    cfg = load_config("sweep_default")
    cfg.update(overrides(str(tmp_path), "", methods=("ddtree",), streams=(2,), requests=5,
                          max_new_tokens=4, timing_reps=2))
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
    assert rec["tokens_per_second_range"][0] <= rec["tokens_per_second"] <= rec["tokens_per_second_range"][1]
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
    cfg = load_config("sweep_default")
    cfg.update(overrides(str(tmp_path), ""))
    points = sweep.grid(cfg, "p")
    assert all(p["backend"] == jax.default_backend() and p["device_kind"] == jax.devices()[0].device_kind
               for p in points)
    log = sweep_io.ResultsLog(str(tmp_path / "r.jsonl"))
    elsewhere = dict(points[0], backend="gpu", device_kind="NVIDIA H200")
    log.append(dict(elsewhere, key=sweep_io.point_key(elsewhere), tokens_per_second=1.0))
    assert sweep_io.point_key(points[0]) not in log


def test_served_points_refuse_a_static_decode_loop(tmp_path):
    """serving.serve runs its own loop: a decode_loop other than "auto" with requests > 0 is an
    error, not recorded and ignored; its timing_reps repeat the served run."""
    cfg = load_config("sweep_default")
    cfg.update(overrides(str(tmp_path), "", requests=4, decode_loop="device"))
    with pytest.raises(ValueError, match="config.decode_loop='device'"):
        sweep.grid(cfg, "p")
    assert [p["timing_reps"] for p in sweep.grid(load_config("serve_h200"), "p")][:1] == [3]


def test_a_point_decodes_every_prompt_and_names_how_it_ran(tmp_path):
    """batches 0 decodes every prompt (the last batch filled by cycling); a record carries the
    dtype and matmul precision in its key (true float32 for a float32 pair), the timing range of
    its repetitions and the metrics; keys hold repository-relative paths."""
    prompts = [[i] for i in range(5)]
    assert sweep._batches(prompts, 2, 0) == [[[0], [1]], [[2], [3]], [[4], [0]]]
    assert sweep._batches(prompts, 2, 1) == [[[0], [1]]]
    cfg = load_config("sweep_default")
    assert sweep.matmul_precision(cfg) == "highest"
    assert sweep.matmul_precision(load_config("sweep_h200")) == "default"
    assert sweep.repo_relative(cfg.target_dir) == os.path.join("assets", "pair", "target")
    cfg.update(overrides(str(tmp_path), "", methods=("ar",), batches=0, timing_reps=2, streams=(2,)))
    with pytest.raises(ValueError, match="config.matmul_precision"):
        sweep.matmul_precision(dict(cfg.to_dict(), matmul_precision="exact"))
    target, drafter, prompts, pair = sweep.load_pair(cfg)
    (p,) = sweep.grid(cfg, pair)
    assert (p["dtype"], p["matmul_precision"]) == ("float32", "highest")
    rec = sweep.run_point(target, drafter, prompts, p, sweep_io.ResultsLog(str(tmp_path / "r.jsonl")), cfg)
    lo, hi = rec["tokens_per_second_range"]
    assert lo <= rec["tokens_per_second"] <= hi
    assert rec["generated"] == len(prompts) * (3 - 1)        # every prompt, first token from the prefill
    assert rec["metrics"]["acceptance_histogram"] == [0, len(prompts) * 2]
    assert rec["metrics"]["ttft_seconds"]["p50"] > 0


def test_a_point_that_is_not_lossless_is_refused(tmp_path, monkeypatch):
    """At temperature 0 a speculative point's tokens must be ar's, taken from ar's record (as in a
    resumed run), before its numbers are recorded: one changed token is an error naming the point,
    the stream and the position."""
    cfg = load_config("sweep_default")
    cfg.update(overrides(str(tmp_path), "", streams=(2,)))
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
    ("shared_budgets", (), "config.shared_budgets must be a non-empty list of ints >= 1"),
    ("shared_budgets", (0, 8), "config.shared_budgets must be a non-empty list of ints >= 1"),
    ("shared_cap", 0, "config.shared_cap must be an int >= 1"),
    ("temperatures", (-0.5,), "config.temperatures must be a non-empty list of numbers >= 0"),
    ("max_new_tokens", 0, "config.max_new_tokens must be an int >= 1"),
    ("batches", -1, "config.batches must be an int >= 0"),
    ("timing_reps", 0, "config.timing_reps must be an int >= 1"),
])
def test_a_sweep_config_the_sweep_cannot_run_is_refused_by_field(field, value, words):
    cfg = load_config("sweep_default")
    if field.startswith("shared"):
        cfg.methods, cfg.shared_budgets = ("ar", "ddtree-shared"), (8,)
    cfg[field] = value
    with pytest.raises(ValueError, match=words):
        sweep.grid(cfg, "pair")
