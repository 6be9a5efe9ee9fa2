"""Sweep results: a crash-safe JSONL log keyed by point parameters, a summary table, plots.

One JSON object per line, each a finished point with a "key" (canonical JSON of the parameters that
identify the point). A line is written whole, flushed and fsynced before the next point starts, so
a killed run loses at most the point in progress; a damaged or torn line is reported and kept, never
cut off, and points whose key is already present are skipped.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Iterable, Sequence

import numpy as np

from ddtree_jax.plotting import new_figure, save_png
from ddtree_jax.bench.timing import STAGES


def point_key(params: dict) -> str:
    """Canonical identity of a sweep point: sorted-key JSON of its parameters."""
    return json.dumps(params, sort_keys=True, separators=(",", ":"))


class ResultsLog:
    """Append-only JSONL results file; `records` maps key -> record for the finished points.

    Opening it reads and never modifies the file. A line that is not a JSON record with a "key"
    (damaged, or torn: a writer killed mid-line) is kept in the file, skipped, and reported in
    `damaged` as (line number, why) with a warning naming the file; the records before and after it
    are read. The next `append` ends a torn last line first, so its record starts a line of its own.
    """

    def __init__(self, path: str):
        self.path = path
        self.records: dict[str, dict] = {}
        self.damaged: list[tuple[int, str]] = []
        self._torn_tail = False
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        if not os.path.exists(path):
            return
        with open(path, "rb") as f:
            data = f.read()
        lines = data.split(b"\n")
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                key = rec["key"]
                if not isinstance(key, str):
                    raise TypeError(f"its key is {type(key).__name__}, not a string")
            except (ValueError, KeyError, TypeError) as e:
                why = ("torn: no end of line" if number == len(lines) else
                       f"not a record ({type(e).__name__}: {e})")
                self.damaged.append((number, why[:200]))
                continue
            self.records.setdefault(key, rec)
        self._torn_tail = bool(data) and not data.endswith(b"\n")
        if self.damaged:
            warnings.warn(f"{path}: skipped damaged line(s) "
                          + "; ".join(f"line {n}: {why}" for n, why in self.damaged)
                          + " (kept in the file)", stacklevel=2)

    def __contains__(self, key: str) -> bool:
        return key in self.records

    def append(self, record: dict) -> None:
        if record["key"] in self.records:
            raise ValueError(f"point already recorded: {record['key']}")
        with open(self.path, "a") as f:
            f.write(("\n" if self._torn_tail else "") + json.dumps(record, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self._torn_tail = False
        self.records[record["key"]] = record


def read_results(path: str) -> list[dict]:
    """The finished points of a results file, in file order."""
    return list(ResultsLog(path).records.values())


def budget_cell(r: dict) -> str:
    """A record's budget as the table shows it: the per-stream budget; "N/cap" for a shared budget
    of N nodes over the streams, at most cap each; "auto/cap" when each step picks N."""
    if r.get("shared_budget") is not None:
        return f"{r['shared_budget']}/{r['budget']}"
    if r["method"] == "ddtree-shared-auto":
        return f"auto/{r['budget']}"
    return str(r["budget"] or "")


METHOD_ORDER = {"ar": 0, "dflash": 1, "ddtree": 2, "ddtree-auto": 3, "ddtree-shared": 4,
                "ddtree-shared-auto": 5}


def summary_table(records: Iterable[dict]) -> str:
    """Markdown table: one row per point, grouped by temperature and streams ("k": engine steps
    per dispatch, or per device-loop check, with the decode loop, "host" or "device"; "tok/s": the
    median over the timed repetitions, "range" their lowest and highest; "tok/step": emitted tokens
    per step over all streams; "tok/full step": the same over the steps in which every stream is
    active; "tok/verified": emitted tokens per verified token; "accept d1 / d2 / d3": of the steps
    that reached depth d - 1, the share that accepted depth d; TTFT and TPOT: medians over the
    streams, ms; "steps": steps in which a stream was active; "device steps": steps the device ran,
    per batch, summed). Served points (continuous batching) add their requests, median request
    seconds and per-request tok/s. Older records leave the cells they lack empty."""
    records = list(records)
    served = any(r.get("requests") for r in records)
    extra = " | requests | request p50 s | request tok/s" if served else ""
    head = ("| T | streams | method | budget | k | tau | tok/s | range | speedup | tok/step | "
            "tok/full step | tok/verified | accept d1 / d2 / d3 | TTFT ms | TPOT ms | step ms | "
            + " | ".join(f"{s} ms" for s in STAGES) + " | steps | device steps" + extra + " |")
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in sorted(records, key=lambda r: (r["temperature"], r["streams"], METHOD_ORDER[r["method"]],
                                            r["budget"] or 0, r.get("shared_budget") or 0)):
        st = r.get("stage_times") or {}
        m = r.get("metrics") or {}
        ms = lambda k: f"{st[k] * 1e3:.2f}" if k in st else ""
        num = lambda k: f"{r[k]:.2f}" if r.get(k) is not None else ""
        p50 = lambda k: f"{m[k]['p50'] * 1e3:.1f}" if (m.get(k) or {}).get("p50") is not None else ""
        rates = m.get("acceptance_rate_by_depth") or []
        accept = " / ".join("" if x is None else f"{x:.2f}" for x in rates[:3])
        lo_hi = r.get("tokens_per_second_range")
        speed = f"{r['speedup']:.2f}x" if r.get("speedup") else ""
        cells = ""
        if served:
            cells = (f" | {r.get('requests') or ''} | "
                     + (f"{r['request_p50_s']:.3f} | {r['request_tokens_per_second']:.1f}"
                        if r.get("requests") else " | "))
        rows.append(f"| {r['temperature']:g} | {r['streams']} | {r['method']} | {budget_cell(r)} | "
                    f"{r.get('steps_per_call', '')} {r.get('loop', '')} | {r['tau']:.2f} | "
                    f"{r['tokens_per_second']:.1f} | "
                    f"{f'{lo_hi[0]:.0f}-{lo_hi[1]:.0f}' if lo_hi else ''} | {speed} | "
                    f"{num('tokens_per_step')} | {num('tokens_per_full_step')} | {num('tokens_per_verified')} | "
                    f"{accept} | {p50('ttft_seconds')} | {p50('tpot_seconds')} | {ms('step')} | "
                    + " | ".join(ms(s) for s in STAGES)
                    + f" | {r['steps']} | {r.get('device_steps', '')}{cells} |")
    return "\n".join(rows)


def _streams(s: int) -> str:
    return f"{s} stream{'' if s == 1 else 's'}"


def sweep_title(records: Sequence[dict], temperature: float) -> str:
    """"<device>, <pair>, <dtype> (matmul <precision>), temperature T" of a sweep's records (the
    distinct values of each, joined)."""
    def values(key, default="?"):
        return "/".join(sorted({str(r.get(key, default)) for r in records})) or default
    return (f"{values('device_kind')}, {values('pair')}, {values('dtype')} "
            f"(matmul {values('matmul_precision')}), temperature {temperature:g}")


def plot_sweep(records: Iterable[dict], path: str | None, temperature: float):
    """Speculative decoding at one temperature -> the Figure (None without matplotlib, the [plots]
    extra), written as a PNG at `path` unless None: tau, tokens/s (bars: the lowest and highest
    timed repetition) and the speedup over ar against the tree budget, a line per stream count
    (ddtree), the auto-chosen budget as a star, ar and dflash as horizontal lines; and the
    acceptance-length histogram of each stream count's fastest ddtree point and its dflash. The
    title names the device, pair, dtype and matmul precision (`sweep_title`)."""
    recs = [r for r in records if r["temperature"] == temperature]
    fig = new_figure(path, figsize=(12, 8), layout="constrained")
    if fig is None:
        return None
    (ax_tau, ax_tps), (ax_speed, ax_hist) = fig.subplots(2, 2)
    panels = ((ax_tau, "tau", "mean acceptance length tau (tokens per step)"),
              (ax_tps, "tokens_per_second", "tokens / s"),
              (ax_speed, "speedup", "speedup over ar at the same streams"))
    for i, s in enumerate(sorted({r["streams"] for r in recs})):
        color = f"C{i}"
        group = [r for r in recs if r["streams"] == s]
        tree = sorted((r for r in group if r["method"] == "ddtree"), key=lambda r: r["budget"])
        for ax, field, _ in panels:
            line = [r for r in tree if r.get(field) is not None]
            if line:
                y = [r[field] for r in line]
                err = None
                if field == "tokens_per_second" and all(r.get("tokens_per_second_range") for r in line):
                    err = np.array([[v - r["tokens_per_second_range"][0], r["tokens_per_second_range"][1] - v]
                                    for v, r in zip(y, line)]).T
                ax.errorbar([r["budget"] for r in line], y, yerr=err, fmt="o-", color=color, capsize=3,
                            label=f"ddtree, {_streams(s)}")
                ax.set_xscale("log", base=2)
            for r in group:
                if r.get(field) is None:
                    continue
                if r["method"] == "ddtree-auto":
                    ax.plot([r["budget"]], [r[field]], "*", ms=14, color=color,
                            label=f"auto budget, {_streams(s)}")
                elif r["method"] in ("ar", "dflash"):
                    ax.axhline(r[field], color=color, ls=":" if r["method"] == "ar" else "--", lw=1,
                               label=f"{r['method']}, {_streams(s)}")
        best = max(tree, key=lambda r: r["tokens_per_second"], default=None)
        for r, ls in ((best, "-"), (next((r for r in group if r["method"] == "dflash"), None), "--")):
            hist = (r or {}).get("metrics", {}).get("acceptance_histogram")
            if hist:
                share = np.asarray(hist, float) / max(1, sum(hist))
                ax_hist.step(np.arange(len(share)), share, where="mid", color=color, ls=ls,
                             label=f"{r['method']}{'@' + str(r['budget']) if r['budget'] else ''}, {_streams(s)}")
    for ax, _, ylabel in panels:
        ax.set_xlabel("tree budget (draft nodes per stream)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    ax_hist.set_xlabel("tokens emitted by one step of one stream (accept length)")
    ax_hist.set_ylabel("share of (stream, step) pairs")
    ax_hist.grid(alpha=0.3)
    for ax in (ax_tps, ax_hist):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle(sweep_title(recs, temperature))
    if path is not None:
        save_png(fig, path)
    return fig


def node_histogram(tree_nodes, cap: int) -> np.ndarray:
    """tree_nodes [batch][stream][step] (a record's) -> [cap + 1] share of the (stream, step) pairs
    of active streams that verified 0..cap draft nodes."""
    counts = np.bincount([n for batch in tree_nodes for row in batch for n in row], minlength=cap + 1)
    return counts / max(1, counts.sum())


def plot_shared(records: Iterable[dict], path: str | None, temperature: float):
    """Shared against uniform budgets at one temperature, a row per stream count -> the Figure (None
    without matplotlib), written as a PNG at `path` unless None: emitted tokens per step while
    every stream is active (records without it: over all steps) and tokens/s against the step's
    total draft nodes N (uniform: N / streams per stream, shared: N over all streams, the per-step
    choice as a star), and the shared points' histograms of draft nodes per stream and step."""
    recs = [r for r in records if r["temperature"] == temperature]
    streams = sorted({r["streams"] for r in recs if r["method"] in ("ddtree-shared", "ddtree-shared-auto")})
    fig = new_figure(path, figsize=(15, 3.6 * len(streams)), layout="constrained")
    if fig is None:
        return None
    axes = fig.subplots(len(streams), 3, squeeze=False)
    for row, s in zip(axes, streams):
        group = [r for r in recs if r["streams"] == s]
        shared = sorted((r for r in group if r["method"] == "ddtree-shared"), key=lambda r: r["shared_budget"])
        uniform = sorted((r for r in group if r["method"] == "ddtree"), key=lambda r: r["budget"])
        field = "tokens_per_full_step" if all(r.get("tokens_per_full_step") for r in shared) else "tokens_per_step"
        for ax, field, title in ((row[0], field, "emitted tokens per step" + (
                                     ", all streams active" if field == "tokens_per_full_step" else "")),
                                 (row[1], "tokens_per_second", "tokens / s")):
            ax.plot([r["budget"] * s for r in uniform], [r[field] for r in uniform], "o-", label="uniform")
            ax.plot([r["shared_budget"] for r in shared], [r[field] for r in shared], "s-", label="shared")
            for r in group:
                if r["method"] == "ddtree-shared-auto":
                    mean_n = np.mean([sum(col) for b in r["tree_nodes"] for col in _steps(b)])
                    ax.plot([mean_n], [r[field]], "*", ms=14, label="shared, N per step (mean N)")
                elif r["method"] == "ar":
                    ax.axhline(r[field], color="gray", ls=":", lw=1, label="ar")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("draft nodes per step over all streams (N)")
            ax.set_ylabel(title.split(",")[0])
            ax.set_title(f"{title}, {_streams(s)} (T {temperature:g})")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        for r in shared:
            hist = node_histogram(r["tree_nodes"], r["budget"])
            row[2].step(np.arange(hist.size), hist, where="mid", label=f"N = {r['shared_budget']}")
        row[2].set_xlabel(f"draft nodes of one stream in one step (cap {shared[0]['budget'] if shared else ''})")
        row[2].set_ylabel("share of (stream, step) pairs")
        row[2].set_title(f"shared: nodes per stream and step, {_streams(s)}")
        row[2].grid(alpha=0.3)
        row[2].legend(fontsize=7)
    fig.suptitle(sweep_title(recs, temperature))
    if path is not None:
        save_png(fig, path)
    return fig


def _steps(batch) -> list[list[int]]:
    """One batch's tree_nodes [stream][step] -> [step][active stream]."""
    return [[row[i] for row in batch if i < len(row)] for i in range(max(map(len, batch), default=0))]
