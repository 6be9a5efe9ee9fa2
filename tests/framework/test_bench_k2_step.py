"""The K2 step benchmark's library (ddtree_jax/bench/k2_step.py): a tiny run on the CPU and its
bookkeeping, the memory plan without devices, bad arguments."""

import json

import pytest

from ddtree_jax.bench import k2_step as kb


class _FakeClocks:
    """timing.GpuClocks as on a power-capped GPU: every window the same samples."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def window(self, t0, t1, gpus=None):
        assert t0 <= t1 and list(gpus) == [0], gpus      # the 1-device mesh's GPU
        return dict(samples=3, sm_mhz=1755.4, sm_mhz_min=1530.0, power_w_max=699.0, power_capped=1.0)


def test_run_tiny_one_device(tmp_path, monkeypatch, capsys):
    """One point with every stage and part timed; the split adds up to the verify, the projection
    and the memory plans are there, the JSON is written; each timing's SM clock window is kept
    (a fake nvidia-smi here) and the verify's is in the table."""
    monkeypatch.setattr(kb, "GpuClocks", _FakeClocks)
    out = tmp_path / "k2.json"
    result = kb.run(kb.Options(preset="tiny", layers=2, devices=(1,), budgets=(2,), streams=(1,), context=8,
                               reps=1, inner=1, out=str(out)))
    assert json.loads(out.read_text())["points"] == json.loads(json.dumps(result["points"], default=str))
    (row,) = result["points"]
    assert row["tokens"] == 3 and row["tokens_per_s"] == pytest.approx(3 / (row["verify_ms"] * 1e-3))
    for stage in ("verify", "draft", "tree", "accept", "attention", "moe", "dense", "head"):
        assert row[f"{stage}_ms"] > 0, stage
    # 2 layers: layer 0 dense, layer 1 MoE; the full tiny has 3 (one dense, two MoE)
    layers = 2 * (row["attention_ms"] + row["rest_ms"]) + row["moe_ms"] + row["dense_ms"] + row["head_ms"]
    assert layers == pytest.approx(row["verify_ms"])
    assert row["full_extrapolated_ms"] == pytest.approx(
        3 * (row["attention_ms"] + row["rest_ms"]) + 2 * row["moe_ms"] + row["dense_ms"] + row["head_ms"])
    assert row["verify_ratio"] == pytest.approx(row["verify_ms"] / row["proj_verify_ms"])
    assert row["proj_verify_ms"] > 0 and row["full_projected_ms"] > row["proj_verify_ms"]
    assert len(result["memory"]["full_plans"]) == 10 and result["memory"]["full_smallest_fit"]["fits"]
    assert result["compile_s"]["1"]["programs"] == 9 and not result["skipped"]
    assert set(row["clocks"]) == {"tree", "verify", "accept", "attention", "moe", "dense", "head"}
    assert row["verify_sm_mhz"] == 1755 and row["verify_power_capped"] == 1.0
    header, _, line = capsys.readouterr().out.strip().splitlines()[-3:]
    assert header.endswith("| SM MHz (verify) |") and line.endswith("| 1755 |"), (header, line)


def test_plan_only_needs_no_devices():
    result = kb.run(kb.Options(preset="tiny", devices=(8,), budgets=(4,), streams=(2,), plan_only=True))
    assert result["memory"]["run_plan_8"]["mesh"] == "1x1x8" and not result["points"]
    assert result["memory"]["full_plans"][0]["fits"]


def test_bad_arguments():
    with pytest.raises(ValueError, match="--layers must lie in"):
        kb.build_configs("tiny", 4, True)
    with pytest.raises(ValueError, match="--budgets must be"):
        kb.parse_ints("budgets", ["4", "x"])
    with pytest.raises(ValueError, match="exceeds the"):
        kb.run(kb.Options(preset="tiny", devices=(64,)))
    with pytest.raises(ValueError, match="--reps and --inner"):
        kb.run(kb.Options(preset="tiny", reps=0))
