"""The roofline's calibrations (`roofline.Calibration`), read from the benchmark records committed in
results/ (the newest record of each benchmark, `report.newest`), never typed in from a past run.

"measured": this repository's kernels on the GPU of their records:
- routed experts (kernel_bench_moe, the rows of the record's "auto" implementation):
  moe_bw_eff = the median over T = 16 / 64 / 256 of the fraction of the copy bandwidth reached
  (sustained under load where the record has a load phase, else the trace's device time);
  moe_mm_eff = FLOPs / device time / the record's bf16 matmul ceiling at its largest T (>= 1024);
  moe_min_us = the device time at T = 1;
- attention (mla_bench, "auto" rows): attn_fixed_us and attn_eff by least squares of
  time = attn_fixed_us + floor / attn_eff over the record's shapes (floor from its own ceilings);
- the tree build (tree_bench, "auto" rows at the record's most streams): build_tree's device time
  per budget.
A part whose record is missing takes the value of ASSUMED, and the calibration's `source` says so
for each part. The bf16 weight GEMMs, the per-layer and per-step overheads and the all-reduce have
no record of their own (a profiler account of the whole step would give them): ASSUMED always.

"marlin": "measured" with the routed experts and attention at published-class kernel efficiencies
(MARLIN_PARTS, each with its source).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from ddtree_jax.bench import report
from ddtree_jax.bench.roofline import Calibration

# fields no committed record measures, with why each value
ASSUMED = dict(
    moe_bw_eff=(0.68, "assumed"), moe_mm_eff=(0.28, "assumed"), moe_min_us=(105.0, "assumed"),
    attn_eff=(0.85, "assumed"), attn_fixed_us=(14.0, "assumed"),
    attn_rows=(64, "the Mosaic GPU MLA kernel's rows per program (pallas_kernels.mla_attention)"),
    dense_bw_eff=(0.80, "assumed: cuBLAS-class bf16 GEMMs at few tokens"),
    dense_mm_eff=(0.80, "assumed"),
    comm_eff=(0.80, "assumed: ring all-reduce at 80% of link bandwidth (no multi-GPU record)"),
    layer_us=(30.0, "assumed: norms, rope, router and cache writes per layer"),
    step_us=(300.0, "assumed: accept, compaction and the host loop per step"),
    tree_us=(((64, 89.0), (256, 119.3), (1024, 532.0)), "assumed: build_tree at S 16"),
)
# the published-class kernels "marlin" puts in place of the measured ones
MARLIN_PARTS = dict(
    moe_bw_eff=(0.70 * 4.8 / 4.27, "Marlin INT4 MoE at 70% of HBM peak (67-73% quoted), as a "
                "fraction of the H200's copy bandwidth (4.27 of 4.8 TB/s)"),
    moe_mm_eff=(0.25, "Marlin at 25% of the bf16 matmul rate once compute-bound"),
    moe_min_us=(20.0, "a 20 us launch-and-load floor per MoE layer"),
    attn_eff=(0.80, "FlashMLA-class attention at 80% of its floor"),
    attn_fixed_us=(10.0, "10 us fixed per attention call"),
)
MOE_BANDWIDTH_TOKENS = (16, 64, 256)
MOE_COMPUTE_TOKENS = 1024          # the matmul efficiency is read at the largest T, at least this


class MissingMeasurement(ValueError):
    """A record lacks the rows a calibration part is read from."""


def _auto_rows(record: dict, key: str) -> list[dict]:
    auto = record.get("auto_impl")
    return [r for r in record["rows"] if r.get("impl", "").split("(")[0] in (auto, "auto") and key in r]


def moe_part(record: dict) -> dict:
    """kernel_bench_moe record -> moe_bw_eff, moe_mm_eff, moe_min_us (module docstring)."""
    rows = {r["T"]: r for r in _auto_rows(record, "device_us")}
    missing = [t for t in (1, *MOE_BANDWIDTH_TOKENS) if t not in rows]
    if max(rows, default=0) < MOE_COMPUTE_TOKENS:
        missing.append(f">= {MOE_COMPUTE_TOKENS}")
    if missing:
        raise MissingMeasurement(f"{record.get('_file', 'kernel_bench_moe record')}: no \"auto\" row "
                                 f"with device_us at T = {missing}")

    def copy_fraction(r):   # the load phase's sustained figure where the record has one
        if "sustained_pct_copy_load" in r:
            return r["sustained_pct_copy_load"] / 100
        return r["floor_s"] * 1e6 / r["device_us"]

    ceilings = record["ceilings"]
    matmul = max(ceilings[k] for k in ("matmul_tflops_xla", "matmul_tflops_torch") if k in ceilings)
    big = rows[max(rows)]
    return dict(moe_bw_eff=float(np.median([copy_fraction(rows[t]) for t in MOE_BANDWIDTH_TOKENS])),
                moe_mm_eff=big["flops"] / (big["device_us"] * 1e-6) / (matmul * 1e12),
                moe_min_us=float(rows[1]["device_us"]))


def attention_part(record: dict) -> dict:
    """mla_bench record -> attn_fixed_us, attn_eff: least squares of time = fixed + floor / eff
    over the "auto" rows (time: device time where traced, else the wall clock)."""
    rows = [r for r in record["rows"] if r.get("impl") == "auto" and r.get("ms")]
    floor = np.array([r["floor_ms"] * 1e3 for r in rows])
    time = np.array([1e3 * (r.get("device_ms") or r["ms"]) for r in rows])
    if len(set(floor.tolist())) < 2:
        raise MissingMeasurement(f"{record.get('_file', 'mla_bench record')}: fewer than 2 \"auto\" "
                                 f"shapes of distinct floors to fit fixed + floor / eff to")
    slope, fixed = np.polyfit(floor, time, 1)
    if slope <= 0:
        raise MissingMeasurement(f"{record.get('_file', 'mla_bench record')}: attention time does not "
                                 f"grow with its floor (slope {slope:.3g})")
    return dict(attn_eff=float(1 / slope), attn_fixed_us=float(max(fixed, 0.0)))


def tree_part(record: dict) -> dict:
    """tree_bench record -> tree_us ((budget, build_tree us), ...) at its most streams."""
    rows = _auto_rows(record, "build_us")
    if not rows:
        raise MissingMeasurement(f"{record.get('_file', 'tree_bench record')}: no \"auto\" build_us rows")
    s = max(r["S"] for r in rows)
    return dict(tree_us=tuple(sorted((int(r["budget"]), float(r["build_us"])) for r in rows if r["S"] == s)))


# (benchmark, reader, the fields it gives)
_PARTS = (("kernel_bench_moe", moe_part, ("moe_bw_eff", "moe_mm_eff", "moe_min_us")),
          ("mla_bench", attention_part, ("attn_eff", "attn_fixed_us")),
          ("tree_bench", tree_part, ("tree_us",)))


def measured(records: dict[str, dict]) -> Calibration:
    """The "measured" calibration from {benchmark: record} (`report.newest`)."""
    values = {k: v for k, (v, _) in ASSUMED.items()}
    sources = {}
    for benchmark, part, fields in _PARTS:
        record, why = records.get(benchmark), f"no {benchmark} record in results/"
        got = None
        if record is not None:
            try:
                got = part(record)
            except MissingMeasurement as e:
                why = str(e)
        for k in fields:
            if got is None:
                sources[k] = f"{ASSUMED[k][1]} ({why})"
            else:
                values[k] = got[k]
                sources[k] = (f"{record.get('_file', benchmark)} ({record['device']['name']}, "
                              f"{record['date'][:10]})")
    for k, (_, why) in ASSUMED.items():
        sources.setdefault(k, why)
    source = "; ".join(f"{k}: {v}" for k, v in sources.items())
    return Calibration("measured", **values, source=source)


def marlin(base: Calibration) -> Calibration:
    """`base` with the routed experts and attention at published-class efficiencies."""
    return dataclasses.replace(
        base, name="marlin", **{k: v for k, (v, _) in MARLIN_PARTS.items()},
        source="; ".join(f"{k}: {why}" for k, (_, why) in MARLIN_PARTS.items())
        + "; the rest as 'measured'")


@functools.cache
def calibrations(results_dir: str = report.RESULTS_DIR) -> dict[str, Calibration]:
    """{"measured": ..., "marlin": ...} from the newest records in results_dir."""
    base = measured(report.newest(results_dir))
    return {"measured": base, "marlin": marlin(base)}


NAMES = ("measured", "marlin")
