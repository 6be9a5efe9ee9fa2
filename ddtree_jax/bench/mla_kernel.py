"""The Mosaic GPU MLA kernel alone (experiments/mla_kernel_bench.py): its operands as
`mosaic_gpu.prepare` makes them, a check against its XLA twin, timing against the roofline floor,
and readers of what the compiler and the kernel report: ptxas -v (registers, spills), the
in-kernel profiler's trace (phases per warpgroup) and the kernel's %globaltimer timeline."""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import re
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax import model
from ddtree_jax.bench import timing
from ddtree_jax.bench.mla import make_inputs, time_jax
from ddtree_jax.progress import track
from pallas_kernels.mla_attention import mosaic_gpu

_TOL = 1e-2         # bf16 O against the float32 twin


def profiled(run, operands) -> dict:
    """run(*operands, profile_dir=d) twice (the trace of the first, cold call is dropped) ->
    profile_phases of the second call's trace."""
    with tempfile.TemporaryDirectory() as d:
        fn = jax.jit(functools.partial(run, profile_dir=d))
        for _ in range(2):
            for name in os.listdir(d):
                os.remove(os.path.join(d, name))
            jax.block_until_ready(fn(*operands))
            jax.effects_barrier()           # the trace is written by a host callback
        names = [n for n in os.listdir(d) if n.endswith("-trace.json")]
        if len(names) != 1:
            raise RuntimeError(f"expected one profiler trace in {d}, found {names}")
        with open(os.path.join(d, names[0])) as f:
            return profile_phases(json.load(f))


def timeline_summary(times, device_us: float | None = None) -> dict:
    """context_attention's timeline (int32 [S, B, K, len(TIMELINE)]: %globaltimer's low word per
    point, then %smid) -> per point the us after the first CTA's start (min, median, max over
    CTAs), per phase the us each CTA spent (median, max), per run index k the median us at which
    its CTAs end (`end_by_run`: the runs that hold the tail end last), the SMs used, the raw
    times (us, [CTA, point]) and each CTA's SM (`smid`), and, with the kernel's device time, the
    us outside every CTA (the launch before the first start and the drain after the last end)."""
    raw = np.asarray(times).astype(np.int64)
    runs = raw.shape[2]
    t = raw.reshape(-1, len(mosaic_gpu.TIMELINE))
    smid, t = t[:, -1], t[:, :-1]
    t = ((t - t[:, :1].min()) % 2 ** 32) / 1e3       # us after the first start (the low word wraps every 4.3 s)
    col = {name: t[:, i] for i, name in enumerate(mosaic_gpu.TIMELINE[:-1])}
    stat = lambda xs: dict(min=float(xs.min()), median=float(np.median(xs)), max=float(xs.max()))  # noqa: E731
    phases = dict(wait_q=col["q_ready"] - col["start"], loops=col["loops_done"] - col["q_ready"],
                  sums=col["sums_done"] - col["loops_done"], stores=col["stores_issued"] - col["sums_done"],
                  store_wait=col["end"] - col["stores_issued"], epilogue=col["end"] - col["loops_done"],
                  consumer_skew=col["loops_done_1"] - col["loops_done"],
                  after_last_load=col["loops_done"] - col["last_load"])
    end_by_run = np.median(col["end"].reshape(-1, runs), axis=0)
    out = dict(ctas=len(t), sms=int(len(np.unique(smid))), points={k: stat(v) for k, v in col.items()},
               phases={k: stat(v) for k, v in phases.items()},
               end_by_run=[round(float(x), 3) for x in end_by_run],
               raw_us=np.round(t, 3).tolist(), smid=smid.tolist())
    if device_us is not None:
        out["device_us"] = device_us
        out["outside_ctas_us"] = device_us - float(col["end"].max())
    return out


@contextlib.contextmanager
def _captured_stdout(into: list):
    """Collects what is written to file descriptor 1 (the compiler's std::cout) into `into`."""
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 1)
        try:
            yield
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
            tmp.seek(0)
            into.append(tmp.read().decode(errors="replace"))


def ptxas_summary(report: str) -> dict:
    """Registers, spill-store and spill-load bytes from a `ptxas -v` report (the last kernel's)."""
    out = {}
    if m := re.findall(r"Used (\d+) registers", report):
        out["registers"] = int(m[-1])
    if m := re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report):
        out["spill_store_bytes"], out["spill_load_bytes"] = map(int, m[-1])
    return out


_ROLES = ("consumer0", "consumer1", "producer")     # warpgroup 0, 1, 2 of a CTA


def profile_phases(trace: dict) -> dict:
    """Mosaic GPU profiler trace (Chrome JSON: B/E events, ts in us, tid = 1 + warpgroup + 3 CTA) ->
    span_us (first event to last), ctas, start_us / end_us (each CTA's first and last event after
    the kernel's first: median, max) and per "role/phase" the duration in us (median, max over
    CTAs; a phase entered several times is summed per CTA)."""
    events = sorted(trace["traceEvents"], key=lambda e: e["ts"])
    if not events:
        return {}
    t0 = events[0]["ts"]
    open_at, spent, first, last = {}, {}, {}, {}
    for e in events:
        cta, role = divmod(e["tid"] - 1, len(_ROLES))
        key = (cta, f"{_ROLES[role]}/{e['name']}")
        first.setdefault(cta, e["ts"] - t0)
        last[cta] = e["ts"] - t0
        if e["ph"] == "B":
            open_at[key] = e["ts"]
        elif key in open_at:
            spent[key] = spent.get(key, 0.0) + e["ts"] - open_at.pop(key)
    stat = lambda xs: dict(median=float(np.median(xs)), max=float(np.max(xs)))  # noqa: E731
    names = sorted({name for _, name in spent})
    return dict(span_us=events[-1]["ts"] - t0, ctas=len(first), start_us=stat(list(first.values())),
                end_us=stat(list(last.values())),
                phases={n: stat([t for (_, m), t in spent.items() if m == n]) for n in names})




def run_kernel_bench(shapes, splits, clusters, epilogues, *, heads: int, dk: int, v_dim: int,
                     balance: bool = False, ceilings: dict | None = None, capture_ptxas: bool = True,
                     lower_only: bool = False, timeline: bool = False, profile: bool = False,
                     progress: bool = True) -> list[dict]:
    """Per (shape "ctx:Q:S", splits, cluster "auto" or a count, epilogue): every stream at ctx with a
    bushy tree of Q nodes, the kernel (`mosaic_gpu.context_attention`, its runs merged above one
    run) checked on stream 0 against its XLA twin, then timed against the floor from `ceilings`
    (timing.measure_ceilings), with its device time per call from a profiler trace; one row each,
    printed as JSON once done. capture_ptxas: read the ptxas -v report that the compile prints
    (MOSAIC_GPU_DUMP_PTXAS, set before anything compiles) into the row (registers, spill bytes).
    profile: also the in-kernel profiler's phases (`profiled`); timeline: also the kernel's
    timeline (`timeline_summary`). lower_only: lower each kernel (and its profile and timeline
    forms, where asked) for CUDA and print a line for it, timing nothing (runs on a CPU).
    progress: a bar on a terminal (ddtree_jax.progress)."""
    scale = dk ** -0.5
    rows = []
    points = list(itertools.product(shapes, splits, clusters, epilogues))
    for shape, n_splits, cluster_flag, epilogue in track(points, "mla kernel", progress):
        ctx, num_q, num_s = map(int, shape.split(":"))
        # The kernel's operands as mla_attention_mosaic prepares them: bushy trees, the cache
        # allocated as engine.setup allocates it (model.aligned_slots(ctx + Q)).
        args = make_inputs(jax.random.key(ctx + num_q + num_s), num_s, num_q, heads, dk, ctx,
                           model.aligned_slots(ctx + num_q), 1)[0]
        operands = jax.jit(mosaic_gpu.prepare)(*args)
        q, _, ctx_lens, _ = operands
        pairs, tail_tiles = mosaic_gpu.tail_counts(ctx_lens, num_q)
        r, r_pad = num_q * heads, q.shape[1]
        cluster = mosaic_gpu.cluster_size(r_pad) if cluster_flag == "auto" else int(cluster_flag)

        def run(*args, cluster=cluster, splits=n_splits, epilogue=epilogue, profile_dir="", timeline=False):
            o, lse, *times = mosaic_gpu.context_attention(*args, num_q=num_q, scale=scale, v_dim=v_dim,
                                                          cluster=cluster, splits=splits, balance=balance,
                                                          profile_dir=profile_dir, epilogue=epilogue, timeline=timeline)
            # above one run, the parts merged as mla_attention_mosaic merges them
            merged = (o, lse) if splits == 1 else (
                mosaic_gpu.combine_splits(o, lse, args[2], num_q=num_q, balance=balance), lse)
            return merged + tuple(times)
        fn = jax.jit(run)
        if lower_only:
            fn.trace(*operands).lower(lowering_platforms=("cuda",))
            if profile:     # the kernel lowers first; the trace's host callback cannot lower off the GPU
                try:
                    jax.jit(functools.partial(run, profile_dir=tempfile.gettempdir())).trace(*operands).lower(
                        lowering_platforms=("cuda",))
                except ValueError as e:
                    if "different from the lowering platform" not in str(e):
                        raise
            if timeline:
                jax.jit(functools.partial(run, timeline=True)).trace(*operands).lower(lowering_platforms=("cuda",))
            print(f"ctx={ctx} Q={num_q} S={num_s} splits={n_splits} cluster={cluster} epilogue={epilogue}: lowered")
            continue
        o_ref, lse_ref = mosaic_gpu.context_attention_xla(operands[0][:1].astype(jnp.float32),
                                                          operands[1][:1].astype(jnp.float32),
                                                          *(t[:1] for t in operands[2:]), num_q=num_q, scale=scale,
                                                          v_dim=v_dim)
        o_ref, lse_ref = np.asarray(o_ref, np.float64), np.asarray(lse_ref, np.float64)
        keys = mosaic_gpu.PAIR * int(pairs[0]) + mosaic_gpu.BLOCK_K * int(tail_tiles[0])   # keys a row block walks
        flops = 2 * num_s * r * keys * (dk + v_dim)
        nbytes = 2 * num_s * (keys * dk + r * (dk + v_dim)) + 4 * num_s * r * operands[3].shape[1]   # + tail bits
        floor = max(nbytes / (ceilings["copy_tbps"] * 1e12),
                    flops / (max(ceilings["matmul_tflops_xla"], ceilings["matmul_tflops_torch"]) * 1e12))
        row = dict(ctx=ctx, q=num_q, s=num_s, splits=n_splits, balance=balance, epilogue=epilogue, cluster=cluster,
                   flops=flops, bytes=nbytes,
                   floor_ms=floor * 1e3)
        try:
            report = []
            with _captured_stdout(report) if capture_ptxas else contextlib.nullcontext():
                o, lse = jax.block_until_ready(fn(*operands))     # compiles: ptxas reports here
            if report:
                row.update(ptxas_summary(report[0]))
            o0 = np.asarray(o[0, :r], np.float64)
            row["rel_err"] = float(np.linalg.norm(o0 - o_ref[0, :r]) / np.linalg.norm(o_ref[0, :r]))
            if n_splits == 1:
                row["lse_err"] = float(np.max(np.abs(np.asarray(lse[0, :r], np.float64) - lse_ref[0, :r])))
            if not row["rel_err"] <= _TOL:
                raise AssertionError(f"wrong output: rel err {row['rel_err']:.1e}")
            sec = time_jax(fn, [operands])
            row.update(ms=sec * 1e3, tflops=flops / sec / 1e12, pct_floor=100 * floor / sec)
            if traced := timing.traced_device_time(fn, *operands, calls=20):
                # device-busy time per call (the kernel, and the merge above one run): no host dispatch
                row.update(device_us=traced["busy_us"], device_pct_floor=100 * floor * 1e6 / traced["busy_us"],
                           kernels=traced["kernels"], top_kernels=traced["top"][:3])
            if profile:
                row["profile"] = profiled(run, operands)
            if timeline:
                timed = jax.jit(functools.partial(run, timeline=True))
                jax.block_until_ready(timed(*operands))           # compile and warm up
                traced_t = timing.traced_device_time(timed, *operands, calls=20)
                # the kernel: the call's longest kernel (the merge, above one run, is far shorter)
                kernel_us = traced_t["top"][0]["us"] if traced_t else None
                row["timeline"] = timeline_summary(timed(*operands)[2], kernel_us)
                row["timeline"]["busy_us"] = traced_t["busy_us"] if traced_t else None
        except Exception as e:  # report and go on
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def report_lines(rows: list[dict]) -> list[str]:
    """run_kernel_bench's rows -> a markdown table (registers, spills, times against the floor),
    then a line per row with a timeline and one per row with a profile."""
    lines = ["| ctx | Q | S | splits | epilogue | cluster | registers | spill bytes (st/ld) | floor ms | ms "
             "| TFLOP/s | % floor | device us | % floor (device) |",
             "|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        spill = f"{r['spill_store_bytes']}/{r['spill_load_bytes']}" if "spill_store_bytes" in r else "-"
        timed = (f"{r['ms']:.3f} | {r['tflops']:.0f} | {r['pct_floor']:.1f}" if "ms" in r
                 else "error | - | -")
        device = f"{r['device_us']:.1f} | {r['device_pct_floor']:.1f}" if "device_us" in r else "- | -"
        splits = f"{r['splits']} balanced" if r.get("balance") and r["splits"] > 1 else r["splits"]
        lines.append(f"| {r['ctx']} | {r['q']} | {r['s']} | {splits} | {r['epilogue']} | {r['cluster']} | "
                     f"{r.get('registers', '-')} | {spill} | {r['floor_ms']:.3f} | {timed} | {device} |")
    for r in rows:
        if t := r.get("timeline"):
            pts = ", ".join(f"{k} {v['median']:.1f}/{v['max']:.1f}" for k, v in t["points"].items())
            ph = ", ".join(f"{k} {v['median']:.2f}/{v['max']:.2f}" for k, v in t["phases"].items())
            lines.append(f"timeline ctx={r['ctx']} Q={r['q']} S={r['s']} splits={r['splits']}: {t['ctas']} CTAs "
                         f"on {t['sms']} SMs; kernel {t.get('device_us')} us (busy {t.get('busy_us')}), outside "
                         f"CTAs {t.get('outside_ctas_us')}; points us median/max: {pts}; phases us median/max: "
                         f"{ph}; median end by run: {t['end_by_run']}")
    for r in rows:
        if p := r.get("profile"):
            phases = ", ".join(f"{n} {v['median']:.1f}/{v['max']:.1f}" for n, v in p["phases"].items())
            lines.append(f"ctx={r['ctx']} Q={r['q']} S={r['s']} splits={r['splits']}: {p['ctas']} CTAs over "
                         f"{p['span_us']:.1f} us; CTA start {p['start_us']['median']:.1f}/"
                         f"{p['start_us']['max']:.1f}, end {p['end_us']['median']:.1f}/{p['end_us']['max']:.1f}; "
                         f"us median/max: {phases}")
    return lines
