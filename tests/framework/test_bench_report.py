"""Benchmark records (ddtree_jax.bench.record) and the generated BENCHMARKS.md (bench.report)."""

import json
import os

import pytest

from ddtree_jax.bench import record, report
from tests import ROOT



def _record(benchmark="tree_bench", date="2026-12-07T10:00:00Z", rows=None, **extra):
    return {"benchmark": benchmark, "command": "python3 experiments/x.py", "commit": "abc",
            "date": date, "device": {"name": "NVIDIA H200", "count": 1, "driver": "1"},
            "versions": {"jax": "0.11.2"}, "ceilings": {"copy_tbps": 4.2},
            "rows": rows if rows is not None else [{"S": 16, "budget": 256, "impl": "pallas_triton",
                                                    "build_us": 97.5}], **extra}


def test_benchmarks_md_is_what_the_generator_writes():
    with open(report.REPORT) as f:
        assert f.read() == report.render(), "BENCHMARKS.md is stale: python -m ddtree_jax.bench.report"


def test_benchmarks_md_is_small_and_every_record_is_valid():
    assert os.path.getsize(report.REPORT) < 40_000
    names = [f for f in os.listdir(report.RESULTS_DIR) if f.endswith(".json")]
    assert names, "results/ holds no record"
    for name in names:
        rec = record.load_result(os.path.join(report.RESULTS_DIR, name))
        assert record.result_name(rec) == name
        assert rec["benchmark"] in {s.benchmark for s in report.SECTIONS}, name


def test_write_result_is_atomic_named_and_nulls_non_finite(tmp_path):
    rec = _record(rows=[{"S": 1, "budget": 4, "impl": "xla", "build_us": float("nan")}])
    path = record.write_result(str(tmp_path), rec)
    assert os.path.basename(path) == "tree_bench_2026-12-07_h200.json"
    assert sorted(os.listdir(tmp_path)) == ["tree_bench_2026-12-07_h200.json"]   # no temp file left
    back = record.load_result(path)
    assert back["rows"][0]["build_us"] is None and back["ceilings"] == {"copy_tbps": 4.2}


@pytest.mark.parametrize("field", record.REQUIRED)
def test_a_record_missing_a_field_is_refused_by_name(field, tmp_path):
    rec = _record()
    del rec[field]
    with pytest.raises(ValueError, match=repr(field)):
        record.write_result(str(tmp_path), rec)
    assert not os.listdir(tmp_path)


def test_a_bad_results_file_is_named(tmp_path):
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(ValueError, match="x.json"):
        report.render(str(tmp_path))
    (tmp_path / "x.json").write_text(json.dumps(dict(_record(), rows={"a": 1})))
    with pytest.raises(ValueError, match="'rows' must be list"):
        report.render(str(tmp_path))


def test_run_info_names_what_ran():
    info = record.run_info("tree_bench", [os.path.join(ROOT, "experiments", "tree_bench.py"), "--n=2"])
    assert info["command"] == "python3 experiments/tree_bench.py --n=2"
    assert info["versions"]["jax"] and info["device"]["count"] >= 1 and info["date"].endswith("Z")
    assert record.gpu_slug("NVIDIA H100 80GB HBM3") == "h100" and record.gpu_slug("cpu") == "cpu"


def test_render_takes_the_newest_record_and_states_each_goal(tmp_path):
    old = _record(date="2026-12-01T00:00:00Z", rows=[{"S": 16, "budget": 256, "impl": "pallas_triton",
                                                       "build_us": 150.0}], auto_impl="pallas_triton")
    new = _record(date="2026-12-05T00:00:00Z", auto_impl="pallas_triton")
    record.write_result(str(tmp_path), old)
    record.write_result(str(tmp_path), new)
    text = report.render(str(tmp_path))
    assert "met by \"auto\" (pallas_triton): 97.5 us at S 16, budget 256" in text
    assert "150.0" not in text and "2026-12-05" in text
    assert text.count("No record yet.") == len(report.SECTIONS) - 1


def test_check_mode_reports_a_stale_file(tmp_path):
    out = tmp_path / "B.md"
    out.write_text("old\n")
    assert report.main(["--check", "--out", str(out)]) == 1
    assert report.main(["--out", str(out)]) == 0
    assert report.main(["--check", "--out", str(out)]) == 0


def test_mla_rows_pair_each_shape_with_its_xla_row(tmp_path):
    shape = dict(ctx=8192, q=16, s=8, lengths="uniform", floor_ms=0.1)
    rows = [dict(shape, impl="xla", ms=0.5, device_ms=0.4), dict(shape, impl="auto", ms=0.2, device_ms=0.125),
            dict(shape, q=64, impl="auto", ms=0.3), dict(shape, impl="auto", error="OOM")]
    record.write_result(str(tmp_path), _record(benchmark="mla_bench", rows=rows))
    text = report.render(str(tmp_path))
    assert "| 8192 | 16 | 8 | auto | 100.0 | 125.0 | 80.0 | 3.20 |" in text
    assert "| 8192 | 64 | 8 | auto | 100.0 | 300.0 | 33.3 | - |" in text
    assert "not met: at 1 of 2 shapes with ctx >= 8k" in text
