"""Helpers shared by the benchmark entry points in experiments/: timing, profiler traces and
markdown tables."""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import tempfile
import time
from typing import Callable, Sequence

import jax
import numpy as np


def median_seconds(fn: Callable, *args, reps: int, inner: int = 1) -> float:
    """Median over `reps` rounds of the seconds per call of fn(*args), after one untimed call
    (compile, warm-up). A round dispatches `inner` calls back to back and waits for the last
    result once, so with inner > 1 the host's dispatch overlaps the device's work."""
    if reps < 1 or inner < 1:
        raise ValueError(f"reps and inner must be >= 1, got reps={reps}, inner={inner}")
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            out = fn(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / inner)
    return float(np.median(times))


def sustain(fn: Callable, *args, seconds: float) -> int:
    """Call fn(*args) back to back for about `seconds` (waiting on every 8th result) -> the calls
    made. Before timing, so that the GPU's clocks have settled: at the onset of load after an idle
    spell the H200 drops its SM clock for a few hundred ms (nvidia-smi: SW power cap, 1575-1875
    against 1980 MHz), which a short measurement right after a host-side check falls into."""
    calls, t0 = 0, time.perf_counter()
    while True:
        out = fn(*args)
        calls += 1
        if calls % 8 == 0:
            jax.block_until_ready(out)
            if time.perf_counter() - t0 >= seconds:
                return calls


class GpuClocks:
    """nvidia-smi sampling the GPU's SM clock, power and clock-event reasons every `interval_ms` in
    the background, as a context manager; `window(t0, t1)` summarises the samples taken between
    host times t0 and t1 (time.time()). A memory-bound kernel whose time follows the SM clock is
    bound inside the SMs; the H200 lowers that clock under its power cap (reason bit 0x4) after
    ~0.5 s of sustained load, so these say which regime a figure was measured in. nvidia-smi
    samples every GPU of the machine; gpus: the indices a window summarises unless it names others
    (a sharded run reads its mesh's GPUs). Without nvidia-smi (a CPU machine) it samples nothing
    and every window is {}."""

    FIELDS = "timestamp,index,clocks.sm,power.draw,clocks_throttle_reasons.active"

    def __init__(self, interval_ms: int = 50, gpus: Sequence[int] = (0,)):
        if not gpus:
            raise ValueError("GpuClocks(gpus=): needs at least one GPU index")
        self.cmd = ["nvidia-smi", f"--query-gpu={self.FIELDS}", "--format=csv,noheader,nounits",
                    f"-lms={interval_ms}"]
        self.gpus = tuple(gpus)
        self.proc, self.log = None, None

    def __enter__(self) -> "GpuClocks":
        import shutil
        import subprocess
        if shutil.which("nvidia-smi"):
            self.log = tempfile.TemporaryFile("w+")
            self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.DEVNULL, text=True)
        return self

    def __exit__(self, *exc) -> None:
        if self.proc:
            self.proc.terminate()
            self.proc.wait()
            self.log.close()
            self.proc = self.log = None

    def window(self, t0: float, t1: float, gpus: Sequence[int] | None = None) -> dict:
        """`clock_window` over [t0, t1] (host time.time()) of `gpus` (default: this sampler's)."""
        if not self.log:
            return {}
        self.log.flush()
        self.log.seek(0)
        return clock_window(self.log.read(), t0, t1, self.gpus if gpus is None else tuple(gpus))


def clock_window(csv_text: str, t0: float, t1: float, gpus: Sequence[int] = (0,)) -> dict:
    """nvidia-smi's `timestamp, index, clocks.sm, power.draw, reasons` lines -> over the samples of
    GPUs `gpus` in [t0, t1]: {samples, sm_mhz (median), sm_mhz_min, power_w_max, power_capped
    (fraction of samples with the SW power cap reason, bit 0x4)}, with more than one GPU also
    gpu_sm_mhz {index: median}; {} when there are none."""
    import datetime
    rows = []
    for line in csv_text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            ts = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            rows.append((ts, int(parts[1]), float(parts[2]), float(parts[3]), int(parts[4], 16)))
        except (ValueError, IndexError):
            continue                      # a header, or a field this driver reports as N/A
    sel = [r for r in rows if t0 <= r[0] <= t1 and r[1] in gpus]
    if not sel:
        return {}
    out = dict(samples=len(sel), sm_mhz=float(np.median([r[2] for r in sel])),
               sm_mhz_min=min(r[2] for r in sel), power_w_max=max(r[3] for r in sel),
               power_capped=sum(bool(r[4] & 0x4) for r in sel) / len(sel))
    if len(gpus) > 1:
        out["gpu_sm_mhz"] = {g: float(np.median([r[2] for r in sel if r[1] == g]))
                             for g in gpus if any(r[1] == g for r in sel)}
    return out


def row_mhz(row: dict) -> str:
    """'wall / trace' median SM MHz of a benchmark row's clock windows (GpuClocks.window under
    "wall_clocks" and "trace_clocks"; '-' for one not sampled), '' where neither was."""
    got = [row.get(k, {}).get("sm_mhz") for k in ("wall_clocks", "trace_clocks")]
    return "" if got == [None, None] else " / ".join("-" if v is None else f"{v:.0f}" for v in got)


LENGTHS = ("uniform", "spread")   # stream_contexts' kinds


def stream_contexts(ctx: int, num_s: int, lengths: str = "uniform") -> list[int]:
    """Each stream's context: ctx for all ("uniform"), or ctx * (2i + 1) / S rounded for stream i
    ("spread": evenly from ctx / S to about 2 ctx, summing to S * ctx up to rounding)."""
    if lengths not in LENGTHS:
        raise ValueError(f"lengths must be one of {LENGTHS}, got {lengths!r}")
    if lengths == "uniform":
        return [ctx] * num_s
    return [round(ctx * (2 * i + 1) / num_s) for i in range(num_s)]


def markdown_table(rows: Sequence[dict], cols: Sequence[str], headers: Sequence[str] | None = None) -> str:
    """Rows (dicts) as a markdown table of columns `cols` (floats to 3 significant digits)."""
    fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else "" if v is None else str(v)
    out = ["| " + " | ".join(headers or cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(out)


def intervals_union(spans: Sequence[tuple[float, float]]) -> float:
    """Total length covered by the (start, end) spans."""
    total, end = 0.0, -np.inf
    for s, e in sorted(spans):
        if e > end:
            total += e - max(s, end)
            end = e
    return total


def kernel_timeline(kernels: Sequence[dict], gap_us: float) -> dict:
    """Kernel events {ts, dur} in us -> busy_ms (union of intervals), span_ms (first start to last
    end), and the idle intervals between them longer than gap_us: gaps (count), gap_ms (sum),
    largest_gap_ms."""
    spans = sorted((k["ts"], k["ts"] + k["dur"]) for k in kernels)
    gaps, reach = [], spans[0][1]
    for s, e in spans[1:]:
        if s - reach > gap_us:
            gaps.append(s - reach)
        reach = max(reach, e)
    return dict(busy_ms=intervals_union(spans) / 1e3, span_ms=(reach - spans[0][0]) / 1e3,
                gaps=len(gaps), gap_ms=sum(gaps) / 1e3, largest_gap_ms=max(gaps, default=0.0) / 1e3)


def device_kernels(trace_dir: str, with_args: bool = False) -> tuple[list[dict], list[str]]:
    """(kernel events {name, ts, dur} in us on the device streams, every process name) of the
    newest trace in trace_dir; with_args: each event also carries the trace's args (for a GPU:
    correlation_id, one per launch, which a CUDA graph's kernels share; hlo_op; ...)."""
    files = sorted(glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True),
                   key=os.path.getmtime)
    if not files:
        return [], []
    with gzip.open(files[-1], "rt") as f:
        events = json.load(f).get("traceEvents", [])
    procs, threads = {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            procs[e["pid"]] = e["args"].get("name", "")
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"].get("name", "")
    device = {pid for pid, name in procs.items() if "/device:GPU" in name or "/device:TPU" in name}
    streams = {k for k, name in threads.items() if k[0] in device and name.startswith("Stream")}
    keep = streams or {k for k in threads if k[0] in device}
    return [dict(name=e.get("name", "?"), ts=float(e["ts"]), dur=float(e.get("dur", 0.0)),
                 **({"args": e.get("args", {})} if with_args else {}))
            for e in events if e.get("ph") == "X" and (e.get("pid"), e.get("tid")) in keep], \
        sorted(procs.values())


def graph_launches(kernels: list[dict]) -> dict:
    """Device kernel events {ts, dur, launch} -> medians over the launches of > 20 kernels:
    kernels, span_us, busy_us, inside_gap_us (idle between its kernels), before_us (idle since
    the previous launch ended)."""
    by = collections.defaultdict(list)
    for k in kernels:
        by[k["launch"]].append(k)
    rows, prev_end = [], None
    for ks in sorted(by.values(), key=lambda ks: min(k["ts"] for k in ks)):
        spans = sorted((k["ts"], k["ts"] + k["dur"]) for k in ks)
        start, end = spans[0][0], max(e for _, e in spans)
        busy = intervals_union(spans)
        rows.append(dict(kernels=len(ks), span_us=end - start, busy_us=busy,
                         inside_gap_us=end - start - busy,
                         before_us=None if prev_end is None else start - prev_end))
        prev_end = end
    big = [r for r in rows if r["kernels"] > 20]
    med = lambda key: float(np.median([r[key] for r in big if r[key] is not None]))  # noqa: E731
    return dict(launches=len(rows), step_launches=len(big),
                **({key: med(key) for key in ("kernels", "span_us", "busy_us", "inside_gap_us",
                                               "before_us")} if len(big) > 1 else {}))


def kernel_summary(kernels: Sequence[dict], per: int, top: int = 8) -> dict:
    """Device time of `per` calls' kernel events, per call: busy_us (union of kernel intervals),
    span_us (first start to last end: busy plus the device's idle gaps between the kernels),
    kernels (count) and the `top` kernels by time [{name, count, us}]."""
    by_name = collections.defaultdict(lambda: [0, 0.0])
    for k in kernels:
        by_name[k["name"]][0] += 1
        by_name[k["name"]][1] += k["dur"]
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]
    spans = [(k["ts"], k["ts"] + k["dur"]) for k in kernels]
    return dict(busy_us=intervals_union(spans) / per,
                span_us=(max(e for _, e in spans) - min(s for s, _ in spans)) / per if spans else 0.0,
                kernels=len(kernels) / per,
                top=[dict(name=n, count=c / per, us=t / per) for n, (c, t) in ranked])


STAGES = ("draft", "tree", "verify", "accept")    # engine.speculative_step's named scopes
_HLO_KERNEL = re.compile(r'^\s*(?:ROOT )?%([\w.\-]+) = .*?\b(fusion|custom-call)\(')
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_SKIP_SEGMENT = re.compile(r"^(jit\(.*\)|while|body|cond|closed_call|checkpoint|remat|pallas_call)$")


def hlo_kernel_scopes(hlo_text: str) -> dict[str, str]:
    """Optimised HLO text (a compiled executable's `as_text()`) -> {kernel name as a profiler trace
    shows it: source scope}. A fusion's kernel carries its instruction's name with '.' as '_'; a
    Pallas call's kernel its own name (backend_config `name`). The scope is the op's name stack
    (a fusion without one: its fused computation's root, else first, op that has one) without
    jit(...), loop and pallas_call segments, layer indices as layers_*, e.g.
    "verify/Decoder/layers_*/self_attn/q_a_proj/dot_general"."""
    comp_op, comp, first = {}, None, None
    for line in hlo_text.splitlines():          # the op name of each computation's root / first op
        head = re.match(r"^%?([\w.\-]+) .*\{$", line)
        if head:
            comp, first = head.group(1), None
            continue
        op = _OP_NAME.search(line)
        if comp and op:
            if line.lstrip().startswith("ROOT"):
                comp_op[comp] = op.group(1)
            elif first is None:
                first = comp_op.setdefault(comp, op.group(1))
    scopes = {}
    for line in hlo_text.splitlines():
        m = _HLO_KERNEL.match(line)
        if not m:
            continue
        op = _OP_NAME.search(line)
        called = re.search(r"calls=%?([\w.\-]+)", line)
        op_name = op.group(1) if op else comp_op.get(called.group(1)) if called else None
        if op_name is None:
            continue
        kernel = re.search(r'\bname = "([^"]+)"', line) if m.group(2) == "custom-call" else None
        name = kernel.group(1) if kernel else m.group(1).replace(".", "_")
        parts = [p for p in op_name.split("/") if not _SKIP_SEGMENT.match(p)]
        scopes.setdefault(name, re.sub(r"layers_\d+", "layers_*", "/".join(parts)))
    return scopes


# The verify's parts by source scope (the first rule that matches; the model's named scopes:
# attention_core, router, routed_experts, lm_head, and its modules' names)
VERIFY_PARTS = (
    ("attention core", r"/self_attn/attention_core(/|$)"),
    ("attention projections", r"/self_attn(/|$)"),     # q / kv projections, their norms, rope, o_proj
    ("router", r"/mlp/(router|gate)(/|$)"),
    ("routed experts", r"/mlp/routed_experts(/|$)"),
    ("shared expert", r"/mlp/shared_experts(/|$)"),
    ("MLP", r"/mlp(/|$)"),                            # dense layers' MLP, the MoE's combine
    ("norms", r"(layernorm|/norm)(/|$)"),
    ("lm_head", r"/lm_head(/|$)"),
    ("embedding", r"/embed_tokens(/|$)"),
    ("layer other", r"/layers_"),                     # residual adds
)


def part_of(scope: str | None) -> str:
    """A kernel's part of the engine step from its source scope (`hlo_kernel_scopes`): the stage
    ("draft", "tree", "accept") or, inside "verify", its VERIFY_PARTS part ("verify other" where
    none matches); "other" outside the stages, "unattributed" without a scope."""
    if scope is None:
        return "unattributed"
    stage = scope.split("/")[0]
    if stage != "verify":
        return stage if stage in STAGES else "other"
    return next((name for name, rule in VERIFY_PARTS if re.search(rule, scope)), "verify other")


def scope_summary(kernels: Sequence[dict], per: int, scopes: dict[str, str], depth: int = 4,
                  top: int = 20) -> dict:
    """Kernel events of `per` calls split by source scope (from `hlo_kernel_scopes`), per call:
    stages {stage: {kernels, us}} by the scope's first segment (STAGES, else "other"; kernels the
    HLO does not name, such as copies, go to "unattributed"), parts {part: {kernels, us}} by
    `part_of` (the verify split into attention core, projections, router, routed and shared
    experts, norms, lm_head, ...; the parts sum to the stages) and the `top` scopes cut to `depth`
    segments [{scope, kernels, us}]. us sums kernel durations (overlaps count twice)."""
    stages = collections.defaultdict(lambda: [0, 0.0])
    cut = collections.defaultdict(lambda: [0, 0.0])
    parts = collections.defaultdict(lambda: [0, 0.0])
    for k in kernels:
        scope = scopes.get(k["name"])
        if scope is None:
            stage, key = "unattributed", f"unattributed/{k['name']}"
        else:
            first = scope.split("/")[0]
            stage = first if first in STAGES else "other"
            key = "/".join(scope.split("/")[:depth]) or "(no scope)"
        for table, name in ((stages, stage), (cut, key), (parts, part_of(scope))):
            table[name][0] += 1
            table[name][1] += k["dur"]
    ranked = sorted(cut.items(), key=lambda kv: -kv[1][1])[:top]
    return dict(stages={n: dict(kernels=c / per, us=t / per) for n, (c, t) in stages.items()},
                parts={n: dict(kernels=c / per, us=t / per) for n, (c, t) in parts.items()},
                scopes=[dict(scope=n, kernels=c / per, us=t / per) for n, (c, t) in ranked])


def traced_device_time(fn: Callable, *args, calls: int = 10, top: int = 8,
                       arg_sets: Sequence[tuple] | None = None, warm: int = 0) -> dict | None:
    """Profile `calls` back-to-back calls of fn(*args) (after one untimed call) -> kernel_summary
    per call, or None when the trace holds no device kernels (a CPU backend). Device time from a
    trace leaves out the host's dispatch, which a wall clock around small calls mostly measures.
    arg_sets: argument tuples the calls cycle through in place of args (each called once untimed
    first), so the figure averages the same inputs as a wall clock that rotates among them.
    warm: calls made inside the trace first, back to back with the counted ones, whose kernels
    (the first warm / (warm + calls) of them by start time) are left out (the first calls after
    the profiler's start). The GPU idles while the profiler starts, so a short trace measures a
    burst at a high SM clock; `load_profile` measures the sustained regime as well.
    host_window: host times (time.time()) from the first counted call's dispatch to the last's end."""
    sets = list(arg_sets) if arg_sets is not None else [args]
    if not sets:
        raise ValueError("arg_sets: needs at least one argument tuple")
    if calls < 1 or warm < 0:
        raise ValueError(f"calls must be >= 1 and warm >= 0, got calls={calls}, warm={warm}")
    for a in sets:
        jax.block_until_ready(fn(*a))
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            for i in range(warm + calls):
                if i == warm:
                    t0 = time.time()
                out = fn(*sets[i % len(sets)])
            jax.block_until_ready(out)
            t1 = time.time()
        kernels, _ = device_kernels(d)
    kernels = sorted(kernels, key=lambda k: k["ts"])[round(len(kernels) * warm / (warm + calls)):]
    return dict(kernel_summary(kernels, calls, top), host_window=(t0, t1)) if kernels else None


def loaded_trace(fn: Callable, arg_sets: Sequence[tuple], load_s: float):
    """fn cycling through arg_sets back to back for load_s seconds inside one profiler trace,
    waiting on every 8th result -> (host start time, calls made, [(host time, calls made)] at each
    wait, the trace's device kernels)."""
    waits = []
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            h0, n = time.time(), 0
            while True:
                out = fn(*arg_sets[n % len(arg_sets)])
                n += 1
                if n % 8 == 0:
                    jax.block_until_ready(out)
                    waits.append((time.time(), n))
                    if waits[-1][0] - h0 >= load_s:
                        break
        kernels, _ = device_kernels(d)
    return h0, n, waits, kernels


def calls_busy(kernels: Sequence[dict], calls: int) -> list[tuple[float, float]]:
    """Trace kernels of `calls` calls that launch a fixed count each -> per call in order (start
    us after the first call's start, busy us: the union of its kernels' intervals)."""
    if len(kernels) % calls:
        raise ValueError(f"{len(kernels)} kernels in the trace are not {calls} calls of one count")
    per, ks = len(kernels) // calls, sorted(kernels, key=lambda k: k["ts"])
    groups = [ks[c * per:(c + 1) * per] for c in range(calls)]
    return [(g[0]["ts"] - ks[0]["ts"], intervals_union([(k["ts"], k["ts"] + k["dur"]) for k in g])) for g in groups]


def load_profile(fn: Callable, arg_sets: Sequence[tuple], *, load_s: float = 3.0, idle_s: float = 2.0,
                 burst_ms: float = 100.0, settled_s: float = 1.0, clocks: "GpuClocks | None" = None) -> dict | None:
    """Device time per call in two regimes, from one `loaded_trace` of `load_s` seconds after
    `idle_s` idle seconds (each set called once untimed first): burst_us is the median busy time
    (`calls_busy`) of the calls that start in the first `burst_ms` (the SM clock still high),
    sustained_us of those that start `settled_s` or more in (on an H200 at T >= 16 MoE tokens, at
    the 700 W cap by then; docs/kernels/moe.md, "Performance"). Also calls, kernels_per_call,
    {burst,sustained}_calls and, with clocks, {burst,sustained}_clocks (GpuClocks windows of the
    same spans). None when the trace holds no device kernels (a CPU)."""
    sets = list(arg_sets)
    if not sets:
        raise ValueError("arg_sets: needs at least one argument tuple")
    if not 0 < burst_ms / 1e3 < settled_s < load_s:
        raise ValueError(f"need 0 < burst_ms / 1000 < settled_s < load_s, got burst_ms={burst_ms}, "
                         f"settled_s={settled_s}, load_s={load_s}")
    for a in sets:
        jax.block_until_ready(fn(*a))
    time.sleep(idle_s)
    h0, n, waits, kernels = loaded_trace(fn, sets, load_s)
    if not kernels:
        return None
    return dict(calls=n, kernels_per_call=len(kernels) // n,
                **regimes(calls_busy(kernels, n), h0, waits[-1][0], burst_ms=burst_ms, settled_s=settled_s,
                          clocks=clocks))


def regimes(calls: Sequence[tuple[float, float]], h0: float, h1: float, *, burst_ms: float, settled_s: float,
            clocks: "GpuClocks | None" = None) -> dict:
    """Calls [(start us after the first call's, us)] of a load that ran from host time h0 to h1 ->
    burst_us / sustained_us (medians of the calls that start in the first burst_ms / from
    settled_s on; None where there are none), burst_calls / sustained_calls and, with clocks,
    burst_clocks / sustained_clocks (GpuClocks windows of the same spans). Also first_us /
    first_calls (/ first_clocks): the calls in the burst window's first quarter, the first call at
    least. A heavy call can be throttled inside the burst window (on an H200, the MoE op at T = 1024
    some 30-40 ms in), so the burst median can land on either side of that step, while the first
    quarter stays before it (docs/kernels/moe.md, "Performance")."""
    out = {}
    for name, lo, hi in (("burst", 0.0, burst_ms * 1e3), ("first", 0.0, burst_ms * 1e3 / 4),
                         ("sustained", settled_s * 1e6, np.inf)):
        sel = [us for start, us in calls if lo <= start < hi]
        out[f"{name}_us"] = float(np.median(sel)) if sel else None
        out[f"{name}_calls"] = len(sel)
        if clocks is not None:
            out[f"{name}_clocks"] = clocks.window(h0 + lo / 1e6, min(h0 + hi / 1e6, h1))
    return out


def define_load_flags(what: str) -> None:
    """A benchmark script's absl flags --load_s and --idle_s (kernel_bench, mla_bench); `what`: what
    --load_s adds, for its help. --load_s of 1 s or less is refused at flag parsing: load_profile's
    sustained window starts 1 s into the load (settled_s)."""
    from absl import flags
    flags.DEFINE_float("load_s", 0.0, f"if > 1 (GPU): also {what}, from one trace of this many seconds of "
                       "back-to-back calls after --idle_s idle (load_profile: a burst, the first 100 ms, and "
                       "sustained load, from 1 s on; the H200 reaches its 700 W cap after ~1 s)")
    flags.DEFINE_float("idle_s", 2.0, "with --load_s: idle seconds before each load")
    flags.register_validator("load_s", lambda v: v == 0 or v > 1.0,
                             message="--load_s must be 0 (off) or more than 1: the sustained window starts "
                                     "1 s into the load (timing.load_profile's settled_s)")


def sustained_torch(op: Callable[[], object], *, load_s: float = 3.0, idle_s: float = 2.0,
                    burst_ms: float = 100.0, settled_s: float = 1.0, clocks: "GpuClocks | None" = None) -> dict:
    """op() (a torch CUDA operation, called once untimed first) in load_profile's two regimes: after
    idle_s, op back to back for load_s seconds, each call timed by its own pair of CUDA events ->
    `regimes` of the per-call us (starts from the first call's), plus calls. The ceilings'
    counterpart of load_profile: whether a ceiling measured in ~0.35 s moves under sustained load."""
    import torch
    op()
    torch.cuda.synchronize()
    time.sleep(idle_s)
    events, h0 = [], time.time()
    while time.time() - h0 < load_s:
        for _ in range(8):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            op()
            b.record()
            events.append((a, b))
        events[-1][1].synchronize()
    h1 = time.time()
    first = events[0][0]
    calls = [(first.elapsed_time(a) * 1e3, a.elapsed_time(b) * 1e3) for a, b in events]
    return dict(regimes(calls, h0, h1, burst_ms=burst_ms, settled_s=settled_s, clocks=clocks), calls=len(calls))


def _rates(profile: dict, work: float, unit: str) -> dict:
    """profile (sustained_torch's) with {burst,first,sustained}_{unit}: work / us (None where no call)."""
    for name in ("burst", "first", "sustained"):
        us = profile[f"{name}_us"]
        profile[f"{name}_{unit}"] = work / (us * 1e-6) if us else None
    return profile


def sustained_copy(*, nbytes: int = 2**30, **load) -> dict:
    """The copy ceiling in both regimes (`sustained_torch` of torch `copy_` of nbytes; needs torch
    on a CUDA GPU): burst_tbps / sustained_tbps count the bytes read + written."""
    import torch
    src = torch.empty(nbytes, device="cuda", dtype=torch.uint8)
    bufs = [src, torch.empty_like(src)]                  # dropped before empty_cache
    del src
    out = _rates(sustained_torch(lambda: bufs[1].copy_(bufs[0]), **load), 2 * nbytes / 1e12, "tbps")
    bufs.clear()
    torch.cuda.empty_cache()
    return out


def sustained_matmul(*, n: int = 8192, **load) -> dict:
    """The bf16 matmul ceiling in both regimes (`sustained_torch` of an n^3 torch product; needs
    torch on a CUDA GPU): burst_tflops / sustained_tflops. It follows the SM clock, as compute-bound
    kernels do, so a compute-bound figure under load is read against this one."""
    import torch
    bufs = [torch.randn(n, n, device="cuda", dtype=torch.bfloat16)]   # dropped before empty_cache
    out = _rates(sustained_torch(lambda: bufs[0] @ bufs[0], **load), 2 * n**3 / 1e12, "tflops")
    bufs.clear()
    torch.cuda.empty_cache()
    return out


def measure_ceilings(clocks: "GpuClocks | None" = None) -> dict:
    """The GPU's ceilings, measured now (needs torch and triton on a CUDA GPU): copy_tbps (torch
    `copy_` of 2 GiB, bytes read + written; an XLA elementwise op reaches less), and the bf16
    matmul rate of an 8192^3 product through XLA and through torch (matmul_tflops_xla, _torch).
    clocks: also each measurement's GpuClocks window (copy_clocks, matmul_xla_clocks,
    matmul_torch_clocks): the matmul rates follow the SM clock (`sustained_copy`,
    `sustained_matmul`: both under a sustained load)."""
    import jax.numpy as jnp
    import torch
    import triton

    def torch_seconds(op, *xs):     # median seconds of op(*xs); xs are freed on return
        return triton.testing.do_bench(lambda: op(*xs), warmup=50, rep=300, return_mode="median") / 1e3

    windows = {}

    def timed(name, measure, *args):    # measure(*args) -> seconds, with its clock window kept
        t0 = time.time()
        sec = measure(*args)
        if clocks is not None:
            windows[f"{name}_clocks"] = clocks.window(t0, time.time())
        return sec

    n = 8192
    xla_s = timed("matmul_xla", lambda x: median_seconds(jax.jit(lambda x: x @ x), x, reps=5, inner=20),
                  jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16))
    torch_s = timed("matmul_torch", torch_seconds, lambda m: m @ m,
                    torch.randn(n, n, device="cuda", dtype=torch.bfloat16))
    src = torch.empty(2**31, device="cuda", dtype=torch.uint8)
    copy_s = timed("copy", torch_seconds, lambda a, b: b.copy_(a), src, torch.empty_like(src))
    del src
    torch.cuda.empty_cache()
    return {"copy_tbps": 2 * 2**31 / copy_s / 1e12, "matmul_tflops_xla": 2 * n**3 / xla_s / 1e12,
            "matmul_tflops_torch": 2 * n**3 / torch_s / 1e12, **windows}
