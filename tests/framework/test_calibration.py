"""The roofline's calibrations read from benchmark records (ddtree_jax.bench.calibration): each
part against the numbers computed by hand from a record, and the assumed parts named."""

import copy
import json

import numpy as np
import pytest

from ddtree_jax.bench import calibration, record, report
from tests import ROOT

RNG = np.random.default_rng()


def _moe_record(device_us: dict[int, float], sustained: dict[int, float] | None = None) -> dict:
    rows = []
    for t, us in device_us.items():
        floor = RNG.uniform(0.5, 0.9) * us * 1e-6
        row = dict(impl="triton(block_m=16)", T=t, floor_s=floor, flops=RNG.uniform(1e9, 1e12), device_us=us)
        if sustained:
            row["sustained_pct_copy_load"] = sustained[t]
        rows.append(row)
    rows.append(dict(impl="pallas_triton", T=1, floor_s=1e-6, flops=1.0, device_us=1.0))   # not "auto"
    return dict(benchmark="kernel_bench_moe", auto_impl="triton", device={"name": "NVIDIA H200"},
                date="2026-12-04T17:42:15Z", ceilings=dict(copy_tbps=4.2, matmul_tflops_xla=700.0,
                                                           matmul_tflops_torch=800.0), rows=rows)


def test_moe_part_by_hand():
    rec = _moe_record({1: 80.0, 4: 200.0, 16: 700.0, 64: 1700.0, 256: 2500.0, 4096: 12000.0})
    rows = {r["T"]: r for r in rec["rows"] if r["impl"].startswith("triton")}
    got = calibration.moe_part(rec)
    assert got["moe_min_us"] == 80.0
    want_bw = np.median([rows[t]["floor_s"] * 1e6 / rows[t]["device_us"] for t in (16, 64, 256)])
    assert got["moe_bw_eff"] == pytest.approx(want_bw, rel=1e-12)
    assert got["moe_mm_eff"] == pytest.approx(rows[4096]["flops"] / 12000e-6 / 800e12, rel=1e-12)
    # a load phase's sustained figure is preferred to the trace's
    sustained = calibration.moe_part(_moe_record({1: 80.0, 16: 700.0, 64: 1700.0, 256: 2500.0, 1024: 4e3},
                                                 {1: 50.0, 16: 80.0, 64: 90.0, 256: 70.0, 1024: 50.0}))
    assert sustained["moe_bw_eff"] == pytest.approx(0.80)


def test_moe_part_names_the_missing_token_counts():
    with pytest.raises(calibration.MissingMeasurement, match=r"T = \[64, 256, '>= 1024'\]"):
        calibration.moe_part(_moe_record({1: 80.0, 16: 700.0}))


def test_attention_part_fits_fixed_plus_floor_over_eff():
    fixed, eff = RNG.uniform(5, 20), RNG.uniform(0.6, 0.95)
    floors = RNG.uniform(20, 2000, 12)
    rows = [dict(impl="auto", ms=1.0, device_ms=(fixed + f / eff) * 1e-3, floor_ms=f * 1e-3) for f in floors]
    rows += [dict(impl="xla", ms=5.0, floor_ms=1e-3)]
    got = calibration.attention_part(dict(rows=rows))
    assert got["attn_eff"] == pytest.approx(eff, rel=1e-9)
    assert got["attn_fixed_us"] == pytest.approx(fixed, rel=1e-9)
    with pytest.raises(calibration.MissingMeasurement, match="fewer than 2"):
        calibration.attention_part(dict(rows=rows[:1]))


def test_tree_part_takes_the_most_streams():
    rows = [dict(impl="pallas", S=s, budget=b, build_us=float(s * b)) for s in (1, 16) for b in (256, 64)]
    got = calibration.tree_part(dict(auto_impl="pallas", rows=rows))
    assert got["tree_us"] == ((64, 1024.0), (256, 4096.0))


def test_measured_reads_each_part_and_names_what_it_assumed():
    rec = _moe_record({1: 80.0, 16: 700.0, 64: 1700.0, 256: 2500.0, 4096: 12000.0})
    cal = calibration.measured({"kernel_bench_moe": rec})
    assert cal.moe_min_us == 80.0 and cal.moe_bw_eff == calibration.moe_part(rec)["moe_bw_eff"]
    assert cal.attn_eff == calibration.ASSUMED["attn_eff"][0]
    assert "attn_eff: assumed (no mla_bench record in results/)" in cal.source
    assert "moe_min_us: kernel_bench_moe (NVIDIA H200, 2026-12-04)" in cal.source
    # a record that lacks the rows falls back too, with the reason
    bad = copy.deepcopy(rec)
    bad["rows"] = [r for r in bad["rows"] if r["T"] != 64]
    assert "T = [64]" in calibration.measured({"kernel_bench_moe": bad}).source
    marlin = calibration.marlin(cal)
    assert marlin.moe_bw_eff == calibration.MARLIN_PARTS["moe_bw_eff"][0]
    assert marlin.step_us == cal.step_us and marlin.name == "marlin"


def test_the_committed_records_calibrate_the_moe():
    """The calibration the projection uses comes from results/, not from typed constants."""
    records = report.newest()
    cal = calibration.calibrations()["measured"]
    assert cal.moe_min_us == calibration.moe_part(records["kernel_bench_moe"])["moe_min_us"]
    assert records["kernel_bench_moe"]["_file"] in cal.source
