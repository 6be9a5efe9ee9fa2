"""BENCHMARKS.md, generated from the result records in `results/` (`ddtree_jax.bench.record`).

Per benchmark (`SECTIONS`): what it measures, its goal and the goal's status in one line, and the
current table from the newest record of that benchmark, with its command, device, versions, commit
and the ceilings measured in the same run. Nothing else: the page holds the current figure of each
benchmark, never a history (superseded records leave `results/` and stay in git history).

    python -m ddtree_jax.bench.report            # rewrite BENCHMARKS.md from results/
    python -m ddtree_jax.bench.report --check    # exit 1 if BENCHMARKS.md differs from what it writes
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import os
import sys
from typing import Callable, Sequence

from ddtree_jax.atomic_io import atomic_write
from ddtree_jax.bench.record import ROOT, load_result

RESULTS_DIR = os.path.join(ROOT, "results")
REPORT = os.path.join(ROOT, "BENCHMARKS.md")


@dataclasses.dataclass(frozen=True)
class Column:
    header: str
    key: str                       # the row's field; rows without it show "-"
    fmt: str = "{}"                # format of a present value

    def cell(self, row: dict) -> str:
        value = row.get(self.key)
        return "-" if value is None else self.fmt.format(value)


@dataclasses.dataclass(frozen=True)
class Section:
    benchmark: str                         # the records' "benchmark" field
    title: str
    measures: str                          # what is measured, how, against which ceiling
    goal: str
    status: Callable[[dict], str]          # newest record -> the goal's status, one line
    columns: tuple[Column, ...]
    rows: Callable[[dict], Sequence[dict]] = lambda record: record["rows"]
    notes: Callable[[dict], str] = lambda record: ""


def _pct_range(rows: Sequence[dict], key: str) -> str:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return f"{min(vals):.1f}-{max(vals):.1f}%" if vals else "-"


def _moe_rows(record: dict) -> list[dict]:
    """Timed rows, with the implementation's name without its config and the derived columns."""
    return [dict(r, impl=r["impl"].split("(")[0], mb=r["bytes"] / 1e6, floor_us=r["floor_s"] * 1e6)
            for r in record["rows"] if "time_us" in r]


def _moe_status(record: dict) -> str:
    auto = record.get("auto_impl")
    rows = [r for r in _moe_rows(record) if r["impl"] == auto and r["T"] in (16, 64, 256)]
    if len(rows) < 3:
        return "not measured in the newest record"
    regimes = [k for k in ("burst_pct_copy_load", "sustained_pct_copy_load") if all(k in r for r in rows)]
    key = regimes or ["pct_copy_device" if all("pct_copy_device" in r for r in rows) else "pct_copy"]
    met = all(r[k] >= 80 for r in rows for k in key)
    parts = [f"{k.split('_')[0] if regimes else 'device time'} "
             + " / ".join(f"{r[k]:.1f}" for r in rows) + "%" for k in key]
    return (f"{'met' if met else 'not met'} by \"auto\" ({auto}) at T = 16 / 64 / 256: "
            + ", ".join(parts) + " of the copy bandwidth" + (" under the same load" if regimes else ""))


def _mla_rows(record: dict) -> list[dict]:
    """mla_bench's timed rows with device time (the trace's, else the wall clock's) in us, its %
    of the floor, and the speedup over the xla row of the same shape."""
    def key(r):
        return r["ctx"], r["q"], r["s"], r.get("lengths")

    def us(r):
        return 1e3 * (r["device_ms"] if r.get("device_ms") else r["ms"])

    timed = [r for r in record["rows"] if r.get("ms")]
    xla = {key(r): us(r) for r in timed if r["impl"] == "xla"}
    return [dict(r, Q=r["q"], S=r["s"], time_us=us(r), floor_us=1e3 * r["floor_ms"],
                 pct_floor=100 * r["floor_ms"] * 1e3 / us(r),
                 speedup_xla=xla[key(r)] / us(r) if key(r) in xla and r["impl"] != "xla" else None)
            for r in timed]


def _mla_status(record: dict) -> str:
    rows = [r for r in _mla_rows(record) if r["impl"] == "auto" and r["ctx"] >= 8192]
    if not rows:
        return "not measured in the newest record"
    ok = [r for r in rows if r["pct_floor"] >= 70 and (r["speedup_xla"] or 0) >= 2]
    return f"{'met' if len(ok) == len(rows) else 'not met'}: at {len(ok)} of {len(rows)} shapes with ctx >= 8k"


def _tree_status(record: dict) -> str:
    rows = [r for r in record["rows"] if r.get("S") == 16 and r.get("budget") == 256
            and r.get("impl") == record.get("auto_impl")]
    if not rows:
        return "not measured in the newest record"
    us = max(r["build_us"] for r in rows)
    return (f"{'met' if us < 100 else 'not met'} by \"auto\" ({record['auto_impl']}): {us:.1f} us at "
            f"S 16, budget 256, {record.get('dtype', '')} logits")


def _sweep_status(record: dict) -> str:
    rows = [r for r in record["rows"] if r.get("method", "").startswith("ddtree") and r.get("speedup")]
    if not rows:
        return "not measured in the newest record"
    best = max(rows, key=lambda r: r["speedup"])
    return (f"{'met' if best['speedup'] >= 3 else 'not met'}: {best['speedup']:.2f}x ar at "
            f"{best['method']}@{best['budget']}, {best['streams']} stream(s)")


SECTIONS: tuple[Section, ...] = (
    Section(
        benchmark="kernel_bench_moe",
        title="INT4 W4A16 routed-expert MoE GEMM (Kimi-K2 layer shape)",
        measures=("`moe_experts` at E 384, d 7168, I 2048, top-8, group 32, bf16 activations, random "
                  "routings: device time per call, bytes of the experts the routing touches over the "
                  "device-to-device copy bandwidth measured in the same run (the floor), and the "
                  "relative error against the float64 numpy golden, checked before timing."),
        goal="the \"auto\" kernel at >= 80% of the copy bandwidth at T = 16..256",
        status=_moe_status,
        columns=(Column("T", "T"), Column("impl", "impl"), Column("active experts", "active_experts", "{:.1f}"),
                 Column("MB moved", "mb", "{:,.0f}"), Column("floor us", "floor_us", "{:,.0f}"),
                 Column("device us", "device_us", "{:,.1f}"), Column("% of copy", "pct_copy_device", "{:.1f}"),
                 Column("burst % of copy*", "burst_pct_copy_load", "{:.1f}"),
                 Column("sustained % of copy*", "sustained_pct_copy_load", "{:.1f}"),
                 Column("rel err", "rel_err", "{:.1e}")),
        rows=_moe_rows,
        notes=lambda record: (
            "Device us: the busy time per call in a profiler trace of back-to-back calls after 1 s of "
            "load. *Burst (the first 100 ms of a 3 s load) and sustained (from 1 s on, the GPU at its "
            "power cap): device time per call against the copy bandwidth timed under the same load. "
            f"\"auto\" takes {record.get('auto_impl')} here.")),
    Section(
        benchmark="mla_bench",
        title="MLA tree-verify attention over the latent cache (Kimi-K2 dims)",
        measures=("`mla_attention` at 64 heads, latent 512 + rope 64: device time per call for S "
                  "streams of ctx cached tokens verifying Q tree nodes each; floor = max(cache bytes "
                  "over the copy bandwidth, FLOPs over the bf16 matmul rate), both measured in the "
                  "same run; every implementation checked against the xla path first."),
        goal="\"auto\" at >= 70% of the floor and >= 2x the xla path at ctx >= 8k",
        status=_mla_status,
        columns=(Column("ctx", "ctx"), Column("Q", "Q"), Column("S", "S"), Column("impl", "impl"),
                 Column("floor us", "floor_us", "{:,.1f}"), Column("time us", "time_us", "{:,.1f}"),
                 Column("% of floor", "pct_floor", "{:.1f}"), Column("x xla", "speedup_xla", "{:.2f}")),
        rows=_mla_rows),
    Section(
        benchmark="tree_bench",
        title="build_tree on the device",
        measures=("`build_tree` (vocabulary top-K + logsumexp, the search, the assembly) on random "
                  "draft logits at V 163,840 and 15 depths: device time per call from a profiler "
                  "trace, against the reference way (device top-k, then a heap per stream on the "
                  "host); every implementation's tree checked against the others first."),
        goal="build_tree < 100 us at S 16, budget 256",
        status=_tree_status,
        columns=(Column("S", "S"), Column("budget", "budget"), Column("impl", "impl"),
                 Column("top-k us", "topk_us", "{:.1f}"), Column("search us", "search_us", "{:.1f}"),
                 Column("assemble us", "assemble_us", "{:.1f}"), Column("build_tree us", "build_us", "{:.1f}"),
                 Column("reference us", "reference_us", "{:,.0f}"))),
    Section(
        benchmark="speculative_sweep",
        title="Speculative decoding on the shipped pair",
        measures=("`generate` on the shipped target and drafter over the held-out prompts, greedy: "
                  "mean acceptance length (tau), tokens per second of the whole decode, and the "
                  "speedup over ar at the same streams; every speculative point's tokens checked "
                  "against ar's first (`parity.check_greedy`)."),
        goal="ddtree >= 3x ar's tokens per second at its best budget",
        status=_sweep_status,
        columns=(Column("method", "method"), Column("budget", "budget"), Column("streams", "streams"),
                 Column("tau", "tau", "{:.2f}"), Column("tokens/s", "tokens_per_second", "{:,.0f}"),
                 Column("x ar", "speedup", "{:.2f}"))),
)


def newest(results_dir: str = RESULTS_DIR) -> dict[str, dict]:
    """benchmark -> its newest record in results_dir (by date; ValueError on a bad file)."""
    best: dict[str, dict] = {}
    for path in sorted(glob.glob(os.path.join(results_dir, "*.json"))):
        record = load_result(path)
        record["_file"] = os.path.relpath(path, ROOT)
        if record["benchmark"] not in best or record["date"] > best[record["benchmark"]]["date"]:
            best[record["benchmark"]] = record
    return best


def _table(columns: Sequence[Column], rows: Sequence[dict]) -> list[str]:
    return (["| " + " | ".join(c.header for c in columns) + " |",
             "|" + "|".join("---" for _ in columns) + "|"]
            + ["| " + " | ".join(c.cell(r) for c in columns) + " |" for r in rows])


def _provenance(record: dict) -> list[str]:
    dev, ver = record["device"], record["versions"]
    versions = ", ".join(f"{k} {v}" for k, v in ver.items() if v)
    ceilings = ", ".join(f"{k} {v:.3g}" for k, v in record["ceilings"].items()
                         if isinstance(v, (int, float)))
    return [f"- command: `{record['command']}`",
            f"- device: {dev['count']} x {dev['name']}" + (f", driver {dev['driver']}" if dev.get("driver") else ""),
            f"- versions: {versions}",
            f"- commit {record['commit']}, {record['date']}; record `{record['_file']}`",
            f"- ceilings measured in the same run: {ceilings or 'none (no GPU)'}"]


def render(results_dir: str = RESULTS_DIR) -> str:
    """The whole of BENCHMARKS.md from the records in results_dir."""
    records = newest(results_dir)
    lines = ["# Benchmarks", "",
             "Generated by `python -m ddtree_jax.bench.report` from the newest record of each benchmark "
             "in `results/`; do not edit by hand. Each record holds the command, commit, device, versions, "
             "the ceilings measured in the same run and every row.", "",
             "## Goals", "", "| benchmark | goal | status |", "|---|---|---|"]
    for s in SECTIONS:
        status = s.status(records[s.benchmark]) if s.benchmark in records else "no record yet"
        lines.append(f"| [{s.title}](#{_anchor(s.title)}) | {s.goal} | {status} |")
    for s in SECTIONS:
        lines += ["", f"## {s.title}", "", s.measures, "", f"Goal: {s.goal}.", ""]
        if s.benchmark not in records:
            lines.append("No record yet.")
            continue
        record = records[s.benchmark]
        lines += [f"Status: {s.status(record)}.", ""] + _table(s.columns, s.rows(record)) + [""]
        note = s.notes(record)
        lines += ([note, ""] if note else []) + _provenance(record)
    return "\n".join(lines) + "\n"


def _anchor(title: str) -> str:
    return "".join(c for c in title.lower().replace(" ", "-") if c.isalnum() or c in "-_")


def write(path: str = REPORT, results_dir: str = RESULTS_DIR) -> None:
    """Write the report atomically."""
    text = render(results_dir)
    with atomic_write(path) as f:
        f.write(text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    parser.add_argument("--results", default=RESULTS_DIR)
    parser.add_argument("--out", default=REPORT)
    args = parser.parse_args(argv)
    if args.check:
        with open(args.out) as f:
            same = f.read() == render(args.results)
        print(f"{args.out} is {'current' if same else 'stale: run python -m ddtree_jax.bench.report'}")
        return 0 if same else 1
    write(args.out, args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
