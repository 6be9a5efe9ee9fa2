"""MLA tree-verify attention benchmark support (experiments/mla_bench.py): inputs of random bushy
trees, timing in and out of a jitted program, golden checks, the sweep over (ctx, Q, S) with its
roofline floors and per-regime floors, and the tables it prints."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax.bench import timing
from ddtree_jax.bench.timing import stream_contexts
from ddtree_jax.progress import track
from ddtree_jax.model import aligned_slots
from pallas_kernels import registry
from pallas_kernels.mla_attention import merge as mla_merge
from pallas_kernels.mla_attention import mosaic_gpu, pallas_triton, two_pass, visibility_to_mask, xla
from pallas_kernels.mla_attention.reference import mla_attention_reference

_GOLDEN_TOL = 1e-2         # bf16 outputs: observed relative errors are about 2e-3


def time_jax(fn, arg_sets, target_s: float = 0.05) -> float:
    """Median seconds per call over 5 batches of back-to-back calls, after a warm-up."""
    jax.block_until_ready(fn(*arg_sets[0]))
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*arg_sets[-1]))
    iters = int(min(200, max(3, target_s / max(time.perf_counter() - t0, 1e-6))))
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for i in range(iters):
            out = fn(*arg_sets[i % len(arg_sets)])
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / iters)
    return statistics.median(times)


def _cycling(fn, arg_sets):
    """A no-argument call of fn on each of arg_sets in turn."""
    it = itertools.count()
    return lambda: fn(*arg_sets[next(it) % len(arg_sets)])


def graph_of(fn):
    """One jitted program that calls fn once on each of its arg sets (distinct inputs, so no call
    is elided), as in a model step: fn(sets)."""
    return jax.jit(lambda sets: [fn(*a) for a in sets])


def time_in_graph(fn, arg_sets, target_s: float = 0.05, batched=None) -> float:
    """Seconds per call inside `graph_of(fn)` (or `batched`, that program already built): the
    host's per-call dispatch, which bounds back-to-back calls of sub-0.1 ms kernels (time_jax),
    is paid once per len(arg_sets) calls."""
    batched = batched or graph_of(fn)
    return time_jax(batched, [(tuple(arg_sets),)], target_s) / len(arg_sets)


def traced_in_graph(fn, arg_sets, batched=None) -> dict | None:
    """Device time per call of fn inside `graph_of(fn)` (or `batched`), from a profiler trace:
    busy_us (union of the kernels' intervals), kernels and the top kernels [{name, count, us}]
    per call, host_window (timing.traced_device_time's); None off the GPU."""
    batched = batched or graph_of(fn)
    traced = timing.traced_device_time(batched, tuple(arg_sets), calls=5)
    if traced is None:
        return None
    n = len(arg_sets)
    return dict(busy_us=traced["busy_us"] / n, kernels=traced["kernels"] / n, host_window=traced["host_window"],
                top=[dict(k, count=k["count"] / n, us=k["us"] / n) for k in traced["top"]])


def bushy_masks(rng, num_s: int, num_q: int) -> np.ndarray:
    """Random trees (parent of node i uniform over earlier nodes): ancestor-or-self [S, Q, Q]."""
    vis = np.zeros((num_s, num_q, num_q), bool)
    for s in range(num_s):
        for i in range(num_q):
            vis[s, i] = vis[s, rng.integers(0, i)] if i else False
            vis[s, i, i] = True
    return vis


def make_inputs(key, num_s, num_q, heads, dk, ctx, num_slots, sets):
    """`sets` input sets (q, kv, ctx_lens, mask) of random bushy trees; ctx: one context for every
    stream, or a list of S per-stream contexts."""
    rng = np.random.default_rng(int(jax.random.randint(key, (), 0, 2**31 - 1)))
    mask = visibility_to_mask(bushy_masks(rng, num_s, num_q))
    ctx_lens = jnp.asarray(np.broadcast_to(np.asarray(ctx, np.int32), (num_s,)))
    out = []
    for k in jax.random.split(key, sets):
        kq, kk = jax.random.split(k)
        q = jax.random.normal(kq, (num_s, num_q, heads, dk), jnp.bfloat16)
        kv = jax.random.normal(kk, (num_s, num_slots, dk), jnp.bfloat16)
        out.append((q, kv, ctx_lens, mask))
    return out


def golden_check(heads, dk, v_dim, configs, impls=("pallas_triton", "xla")) -> dict:
    """Ragged small case at full head layout: each pallas config and xla vs the float64 golden."""
    num_s, num_q, ctx = 3, 37, [0, 1000, 2085]
    rng = np.random.default_rng(1)
    q = jnp.asarray(rng.standard_normal((num_s, num_q, heads, dk)), jnp.bfloat16)
    kv = jnp.asarray(rng.standard_normal((num_s, max(ctx) + num_q + 11, dk)), jnp.bfloat16)
    ctx_lens, mask = jnp.asarray(ctx, jnp.int32), visibility_to_mask(bushy_masks(rng, num_s, num_q))
    scale = dk ** -0.5
    ref = mla_attention_reference(q, kv, ctx_lens, mask, scale=scale, v_dim=v_dim)
    errs = {"xla": _rel(xla.mla_attention_xla(q, kv, ctx_lens, mask, scale=scale, v_dim=v_dim), ref)}
    extra = {"mosaic_gpu": mosaic_gpu.mla_attention_mosaic, "auto": registry.get("mla_attention", "auto")}
    for name in (n for n in extra if n in impls):
        try:
            errs[name] = _rel(extra[name](q, kv, ctx_lens, mask, scale=scale, v_dim=v_dim), ref)
        except Exception as e:  # report and go on
            errs[name] = f"{type(e).__name__}: {_short(e)}"
    for name, cfg in configs.items():
        for splits in ((1, 5) if isinstance(cfg, pallas_triton.BlockConfig) else (None,)):   # auto, two-pass: as is
            cfg_s = dataclasses.replace(cfg, num_splits=splits) if splits else cfg
            key = f"pallas {name}" + (f" splits={splits}" if splits else "")
            try:
                out = pallas_triton.mla_attention_pallas(q, kv, ctx_lens, mask, scale=scale, v_dim=v_dim,
                                                         config=cfg_s, poison=True)
                errs[key] = _rel(out, ref)
            except Exception as e:  # report and go on: one config failing must not end the run
                errs[key] = f"{type(e).__name__}: {_short(e)}"
    bad = {k: v for k, v in errs.items() if not (isinstance(v, float) and v <= _GOLDEN_TOL)}
    if bad:
        print(f"golden check FAILED (tolerance {_GOLDEN_TOL}): {bad}")
    return errs


def golden_slice(args, scale: float, v_dim: int, nodes: int = 8):
    """Float64 golden for streams 0 and S-1, heads 0 and H-1, the first `nodes` tree nodes.

    The first k nodes of a tree whose parents precede their children see only tokens among
    themselves, so the slice is a self-contained problem. Returns (index into the output, golden).
    """
    q, kv, ctx_lens, mask = args
    streams, heads, k = [0, q.shape[0] - 1], [0, q.shape[2] - 1], min(nodes, q.shape[1])
    sub_q = q[np.ix_(streams, range(k), heads)]
    ref = mla_attention_reference(sub_q, kv[np.array(streams)], ctx_lens[np.array(streams)],
                                  mask[np.array(streams), :k, :1], scale=scale, v_dim=v_dim)
    return np.ix_(streams, range(k), heads), ref


def _short(e: Exception) -> str:
    """The first line that names an error (compiler dumps are long)."""
    lines = str(e).splitlines()
    return next((ln for ln in lines if "error" in ln.lower()), lines[0] if lines else "")[:300]


def _rel(out, ref) -> float:
    out = np.asarray(out, np.float64)
    if not np.all(np.isfinite(out)):
        return float("inf")
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def two_pass_parts(args, cfg, scale: float, v_dim: int, sets) -> dict:
    """Pass 1 (scores) and pass 2 (P @ V) of a two-pass config timed alone on args (q [S,Q,H,Dk]);
    returns their ms and TFLOP/s (pass 1: 2 S R N Dk FLOPs, pass 2: 2 S R N v_dim over N = ctx + Q)."""
    q, kv, ctx_lens, mask = args[0]
    num_s, num_q, num_h, dk = q.shape
    cfg = two_pass.fit_config(cfg, v_dim)
    kw = dict(v_dim=v_dim, num_q=num_q, config=cfg)
    scores = jax.jit(lambda q, kv, lens, m: two_pass.scores(
        q.reshape(num_s, -1, dk), q.reshape(num_s, -1, dk), kv, lens, two_pass.row_masks(m, num_h, False, cfg),
        scale=scale, rope=dk - v_dim, rope_col=v_dim, **kw))
    pv = jax.jit(lambda p, m, l, kv, lens: two_pass.pv(p, m, l, kv, lens, out_dtype=q.dtype, **kw))
    p_sets = [(*scores(*a), a[1], a[2]) for a in args[:sets]]
    sec_scores, sec_pv = time_jax(scores, args[:sets]), time_jax(pv, p_sets)
    work = 2 * num_q * num_h * int(jnp.sum(ctx_lens + num_q))
    return dict(scores_ms=sec_scores * 1e3, pv_ms=sec_pv * 1e3, scores_tflops=work * dk / sec_scores / 1e12,
                pv_tflops=work * v_dim / sec_pv / 1e12)


def mosaic_parts(args, scale: float, v_dim: int, context=None) -> dict:
    """mosaic_gpu's wrapper (mla_attention_mosaic) in its parts, each timed in-graph on args:
    prep (the query padding and the tail's mask words: mosaic_gpu.prepare), the kernel,
    and, where the context is split, the merge of its runs that the wrapper takes
    (mosaic_gpu.merge_runs' default: the Pallas merge, its form named in "merge"). context: the
    kernel (default) or its XLA twin (CPU tests)."""
    context = context or mosaic_gpu.context_attention
    prep = jax.jit(mosaic_gpu.prepare)
    prepared = [prep(*a) for a in args]
    cluster, splits = mosaic_gpu.launch(*prepared[0][:2])
    kernel = jax.jit(functools.partial(context, num_q=args[0][0].shape[1], scale=scale, v_dim=v_dim,
                                       cluster=cluster, splits=splits))
    out = dict(splits=splits, prep_ms=time_in_graph(prep, args) * 1e3,
               kernel_ms=time_in_graph(kernel, prepared) * 1e3)
    if splits > 1:
        dtype = args[0][0].dtype
        merge = jax.jit(lambda o, lse, lens: mosaic_gpu.merge_runs(o, lse, lens, dtype, num_q=args[0][0].shape[1]))
        out.update(merge=mla_merge.form_for(splits),
                   merge_ms=time_in_graph(merge, [(*kernel(*p), p[2]) for p in prepared]) * 1e3)
    return out


def words_context(q, kv, ctx_lens, node_word, **kw):
    """mosaic_gpu.context_attention with a decode call's mask as per-row words, made by XLA before
    the kernel (one more small kernel), instead of in the kernel from the context length."""
    return mosaic_gpu.context_attention(q, kv, ctx_lens, mosaic_gpu.decode_words(ctx_lens, node_word, q.shape[1]),
                                        **kw)


def run_mla_bench(ctxs, qs, streams, *, heads=64, dk=576, v_dim=512, configs=None,
                  impls=("pallas_triton", "xla"), ceilings=None, budget_s=0.0, parts=False,
                  in_graph=False, trace=False, mosaic_splits=(), mosaic_merges=(), mosaic_balance=False,
                  mosaic_decode_words=False, lengths=("uniform",), warm_s=0.0, clocks=None, max_sets=8,
                  load_s=0.0, idle_s=2.0, log=print, on_row=None, progress=True) -> list[dict]:
    """Time every (ctx, Q, S, lengths) shape; returns one dict per (shape, implementation or config).

    The cache has aligned_slots(longest context + Q) slots, as engine.setup allocates; each
    stream's context is given by `stream_contexts(ctx, S, lengths)` (LENGTHS: uniform or spread,
    the same total) and the Q tree nodes' entries follow it. in_graph: also time_in_graph (graph_ms).
    trace: also traced_in_graph (device_ms, its % of the floor, kernels, top_kernels).
    mosaic_splits: with "mosaic_gpu" in impls, also rows "mosaic_gpu sN" split into N runs.
    mosaic_merges: likewise rows "mosaic_gpu merge=M" (mosaic_gpu.MERGES) at the default run count.
    mosaic_balance: likewise a row "mosaic_gpu balanced" (mla_attention_mosaic(balance=True)).
    mosaic_decode_words: likewise at Q 1 a row "mosaic_gpu words", the kernel given the tail's mask
    as per-row words made by XLA (`words_context`) instead of in its decode form.

    warm_s > 0: that many seconds of back-to-back calls before each wall clock (timing.sustain).
    clocks: a timing.GpuClocks; each row gets the SM clock of its wall-clock and traced windows
    (wall_clocks, trace_clocks): the compute-bound shapes follow that clock, which the H200 lowers
    under its 700 W cap after ~1 s of load (docs/kernels/moe.md).
    max_sets: at most this many input sets per shape (fewer where 256 MB of caches holds fewer;
    at least 2), cycled by the timings and called once each inside the in-graph program.
    budget_s > 0: shapes not started within budget_s seconds of the call are skipped (logged).
    load_s > 1 (GPU): also each row's `timing.load_profile` ("load": burst / first / sustained device
    us per call) and {burst,first,sustained}_floor_ms / _pct_floor, the floor from ceilings' copy_load and
    matmul_load (sustained_copy / sustained_matmul) in the same regime where given, else the run's.
    parts: for two-pass configs, also each pass alone (two_pass_parts); for mosaic_gpu, its parts
    (mosaic_parts).
    on_row: called with the rows so far after each row (main writes --out there, so a run cut off
    by a shell timeout keeps every finished row). progress: a bar on a terminal (ddtree_jax.progress).
    """
    configs = configs or {"auto": None}
    ceilings = ceilings or timing.measure_ceilings()
    copy_bw = ceilings["copy_tbps"] * 1e12
    rate = max(ceilings["matmul_tflops_xla"], ceilings["matmul_tflops_torch"]) * 1e12
    scale = dk ** -0.5
    rows = []
    t_start = time.perf_counter()
    for ctx, num_q, num_s, spread in track(list(itertools.product(ctxs, qs, streams, lengths)), "mla",
                                           progress):
        if budget_s > 0 and time.perf_counter() - t_start > budget_s:
            log(f"ctx={ctx:6d} Q={num_q:4d} S={num_s:3d} {spread} skipped: past --budget_s={budget_s:.0f}")
            continue
        contexts = stream_contexts(ctx, num_s, spread)
        num_slots = aligned_slots(max(contexts) + num_q)     # the cache as engine.setup allocates it
        flops = 2 * num_q * heads * (sum(contexts) + num_s * num_q) * (dk + v_dim)
        nbytes = 2 * ((sum(contexts) + num_s * num_q) * dk + num_s * num_q * heads * (dk + v_dim))
        floor = max(nbytes / copy_bw, flops / rate)
        sets = int(min(max_sets, max(2, -(-(256 << 20) // (2 * num_s * num_slots * dk)))))
        args = make_inputs(jax.random.key(ctx * 7 + num_q * 3 + num_s), num_s, num_q, heads, dk,
                           contexts, num_slots, sets)
        fns = {}
        if "xla" in impls:
            fns["xla"] = jax.jit(lambda *a: xla.mla_attention_xla(*a, scale=scale, v_dim=v_dim))
        if "pallas_triton" in impls:
            for name, cfg in configs.items():
                fns[f"pallas {name}"] = jax.jit(
                    lambda *a, cfg=cfg: pallas_triton.mla_attention_pallas(
                        *a, scale=scale, v_dim=v_dim, config=cfg))
        if "mosaic_gpu" in impls:
            fns["mosaic_gpu"] = jax.jit(
                lambda *a: mosaic_gpu.mla_attention_mosaic(*a, scale=scale, v_dim=v_dim))
            for n in mosaic_splits:
                fns[f"mosaic_gpu s{n}"] = jax.jit(
                    lambda *a, n=n: mosaic_gpu.mla_attention_mosaic(*a, scale=scale, v_dim=v_dim, splits=n))
            if mosaic_balance:
                fns["mosaic_gpu balanced"] = jax.jit(
                    lambda *a: mosaic_gpu.mla_attention_mosaic(*a, scale=scale, v_dim=v_dim, balance=True))
            if mosaic_decode_words and num_q == 1:
                fns["mosaic_gpu words"] = jax.jit(
                    lambda *a: mosaic_gpu.mla_attention_mosaic(*a, scale=scale, v_dim=v_dim, context=words_context))
            for m in mosaic_merges:
                fns[f"mosaic_gpu merge={m}"] = jax.jit(
                    lambda *a, m=m: mosaic_gpu.mla_attention_mosaic(*a, scale=scale, v_dim=v_dim, merge=m))
        if "auto" in impls:
            auto = registry.get("mla_attention", "auto")
            fns["auto"] = jax.jit(lambda *a: auto(*a, scale=scale, v_dim=v_dim))
        ref = fns["xla"](*args[0]) if "xla" in fns else None
        if any(name != "xla" for name in fns):
            gold_idx, gold = golden_slice(args[0], scale, v_dim)
        for name, fn in fns.items():
            row = dict(ctx=ctx, q=num_q, s=num_s, lengths=spread, impl=name, flops=flops,
                       bytes=nbytes, floor_ms=floor * 1e3)
            try:
                if name != "xla":
                    out = np.asarray(fn(*args[0]))
                    row["rel_err_golden"] = _rel(out[gold_idx], gold)
                    if ref is not None:
                        row["rel_err_vs_xla"] = _rel(out, np.asarray(ref, np.float64))
                    if max(row["rel_err_golden"], row.get("rel_err_vs_xla", 0.0)) > _GOLDEN_TOL:
                        raise AssertionError(f"wrong output: {row['rel_err_golden']:.1e} vs golden, "
                                             f"{row.get('rel_err_vs_xla', 0.0):.1e} vs xla")
                    del out
                if warm_s > 0:
                    timing.sustain(_cycling(fn, args), seconds=warm_s)
                t0 = time.time()
                sec = time_jax(fn, args)
                row.update(ms=sec * 1e3, pct_floor=100 * floor / sec, tflops=flops / sec / 1e12)
                if clocks is not None:
                    row["wall_clocks"] = clocks.window(t0, time.time())
                batched = graph_of(fn)
                if in_graph:
                    sec = time_in_graph(fn, args, batched=batched)
                    row.update(graph_ms=sec * 1e3, graph_pct_floor=100 * floor / sec)
                if trace and (traced := traced_in_graph(fn, args, batched=batched)):
                    row.update(device_ms=traced["busy_us"] / 1e3,
                               device_pct_floor=100 * floor * 1e6 / traced["busy_us"],
                               kernels=traced["kernels"], top_kernels=traced["top"])
                    if clocks is not None:
                        row["trace_clocks"] = clocks.window(*traced["host_window"])
                if load_s > 0 and (lp := timing.load_profile(fn, args, load_s=load_s, idle_s=idle_s,
                                                                 clocks=clocks)):
                    row["load"] = lp
                    row.update(regime_floors(lp, flops, nbytes, ceilings))
                if parts and name == "mosaic_gpu":
                    row.update(mosaic_parts(args, scale, v_dim))
                elif parts and name.startswith("pallas"):
                    cfg = (configs[name.removeprefix("pallas ")]
                           or pallas_triton.select_config(num_q * heads, num_slots, v_dim, num_s))
                    if isinstance(cfg, two_pass.TwoPassConfig):
                        row.update(two_pass_parts(args, cfg, scale, v_dim, min(2, len(args))))
            except Exception as e:  # one failing config must not end the sweep
                row["error"] = f"{type(e).__name__}: {_short(e)}"
            rows.append(row)
            log(format_row(row))
            if on_row is not None:
                on_row(rows)
        del args, ref
    return rows


REGIMES = ("burst", "first", "sustained")   # timing.regimes' windows: 100 ms, its first 25 ms, from 1 s on


def regime_floors(load: dict, flops: float, nbytes: float, ceilings: dict) -> dict:
    """load_profile's burst_us / first_us / sustained_us of a call of `flops` and `nbytes` -> per regime its
    floor (ms) and % of it, the floor max(bytes / copy, FLOPs / matmul) from ceilings' copy_load
    (TB/s) and matmul_load (TFLOP/s) of that regime where measured, else copy_tbps and the larger
    of matmul_tflops_xla / _torch (measure_ceilings)."""
    out = {}
    for regime in REGIMES:
        copy = ceilings.get("copy_load", {}).get(f"{regime}_tbps") or ceilings["copy_tbps"]
        mm = (ceilings.get("matmul_load", {}).get(f"{regime}_tflops")
              or max(ceilings["matmul_tflops_xla"], ceilings["matmul_tflops_torch"]))
        floor = max(nbytes / (copy * 1e12), flops / (mm * 1e12))
        out[f"{regime}_floor_ms"] = floor * 1e3
        if (us := load.get(f"{regime}_us")):
            out[f"{regime}_pct_floor"] = 100 * floor / (us * 1e-6)
    return out


def format_row(r: dict) -> str:
    """One row (run_mla_bench's) as the line the sweep logs."""
    spread = " spread" if r.get("lengths") == "spread" else ""
    head = f"ctx={r['ctx']:6d}{spread} Q={r['q']:4d} S={r['s']:3d} {r['impl']:22s}"
    if "error" in r:
        return f"{head} ERROR {r['error']}"
    err = f" gold={r['rel_err_golden']:.1e}" if "rel_err_golden" in r else ""
    err += f" xla={r['rel_err_vs_xla']:.1e}" if "rel_err_vs_xla" in r else ""
    if "prep_ms" in r:
        err += (f" | {r['splits']} runs: prep {r['prep_ms']:.3f} ms, kernel {r['kernel_ms']:.3f} ms"
                + (f", merge ({r['merge']}) {r['merge_ms']:.3f} ms" if "merge_ms" in r else ""))
    if "scores_ms" in r:
        err += (f" | scores {r['scores_ms']:.3f} ms {r['scores_tflops']:.0f} TF/s, "
                f"P@V {r['pv_ms']:.3f} ms {r['pv_tflops']:.0f} TF/s")
    graph = f" in-graph {r['graph_ms']:.3f} ms {r['graph_pct_floor']:.1f}%" if "graph_ms" in r else ""
    if "device_ms" in r:
        graph += (f" device {r['device_ms']:.3f} ms {r['device_pct_floor']:.1f}% ({r['kernels']:.0f} kernels: "
                  + ", ".join(f"{k['name'][:24]} {k['us']:.1f}" for k in r["top_kernels"][:4]) + " us)")
    for regime in REGIMES:
        if (us := r.get("load", {}).get(f"{regime}_us")):
            graph += f" {regime} {us:.1f} us {r[f'{regime}_pct_floor']:.1f}%"
    return (f"{head} {r['ms']:9.3f} ms  floor {r['floor_ms']:8.3f} ms  {r['pct_floor']:5.1f}% "
            f"{r['tflops']:6.1f} TF/s{graph}{err}")


def table(rows: list[dict]) -> str:
    """Markdown: one line per shape, the best of the kernels (pallas configs, mosaic_gpu, auto) vs xla;
    in-graph: that kernel's time_in_graph, device: its traced device-busy time (where measured), and
    the SM clock of its wall-clock and traced windows (where sampled).
    ctx carries "spread" where the streams' contexts spread around it (stream_contexts)."""
    out = ["| ctx | Q | S | GFLOP | MB | floor ms | best ms | % floor | in-graph ms | in-graph % floor "
           "| device ms | device % floor | xla ms | speedup | kernel | SM MHz wall / trace |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    key = lambda r: (r["ctx"], r["q"], r["s"], r.get("lengths", "uniform"))  # noqa: E731
    for shape in sorted({key(r) for r in rows}):
        rs = [r for r in rows if key(r) == shape and "ms" in r]
        pal = [r for r in rs if r["impl"] != "xla"]
        xla = [r for r in rs if r["impl"] == "xla"]
        if not pal:
            continue
        best = min(pal, key=lambda r: r["ms"])
        x = f"{xla[0]['ms']:.3f} | {xla[0]['ms'] / best['ms']:.2f}x" if xla else "- | -"
        graph = f"{best['graph_ms']:.3f} | {best['graph_pct_floor']:.1f}" if "graph_ms" in best else "- | -"
        graph += (f" | {best['device_ms']:.3f} | {best['device_pct_floor']:.1f}" if "device_ms" in best
                  else " | - | -")
        ctx = f"{shape[0]}" + (" spread" if shape[3] == "spread" else "")
        out.append(f"| {ctx} | {shape[1]} | {shape[2]} | {best['flops'] / 1e9:.1f} | "
                   f"{best['bytes'] / 1e6:.1f} | {best['floor_ms']:.3f} | {best['ms']:.3f} | "
                   f"{best['pct_floor']:.1f} | {graph} | {x} | {best['impl']} | {timing.row_mhz(best)} |")
    return "\n".join(out)


def regimes_table(rows: list[dict], ceilings: dict | None = None) -> str:
    """Markdown: per row with a load profile (load_s), device ms per call in a burst, in its first
    25 ms and under sustained load, each with its % of that regime's floor (and SM MHz: none for
    the first 25 ms, shorter than nvidia-smi's 50 ms samples), and the xla path's time over the
    row's in each regime (where xla has a profile); headed by the load ceilings, if measured."""
    def cell(r, regime, clock=True):
        ms = r["load"].get(f"{regime}_us")
        if ms is None:
            return "-"
        mhz = r["load"].get(f"{regime}_clocks", {}).get("sm_mhz")
        return (f"{ms / 1e3:.3f} ({r.get(f'{regime}_pct_floor', float('nan')):.1f}"
                + (f", {'-' if mhz is None else f'{mhz:.0f}'})" if clock else ")"))

    def rate(d, regime, unit):
        v = (d or {}).get(f"{regime}_{unit}")
        return "-" if v is None else f"{v:.3g}"
    lines = []
    cl = ceilings or {}
    if "copy_load" in cl or "matmul_load" in cl:
        lines += ["ceilings under the same load: copy "
                  + " / ".join(rate(cl.get('copy_load'), g, 'tbps') for g in REGIMES) + " TB/s, bf16 matmul (torch) "
                  + " / ".join(rate(cl.get('matmul_load'), g, 'tflops') for g in REGIMES)
                  + " TFLOP/s (burst / first 25 ms / sustained)", ""]
    lines += ["| ctx | Q | S | impl | burst ms (% floor, SM MHz) | first 25 ms ms (% floor) "
              "| sustained ms (% floor, SM MHz) | xla / this, burst / first 25 ms / sustained |",
              "|---:|---:|---:|---|---|---|---|---|"]
    key = lambda r: (r["ctx"], r["q"], r["s"], r.get("lengths", "uniform"))  # noqa: E731
    for r in sorted((r for r in rows if "load" in r), key=lambda r: key(r) + (r["impl"],)):
        x = next((o for o in rows if key(o) == key(r) and o["impl"] == "xla" and "load" in o), None)
        ratio = "-"
        if x is not None and r["impl"] != "xla":
            got = [(x["load"].get(f"{g}_us"), r["load"].get(f"{g}_us")) for g in REGIMES]
            ratio = " / ".join(f"{a / b:.2f}x" if a and b else "-" for a, b in got)
        ctx = f"{r['ctx']}" + (" spread" if r.get("lengths") == "spread" else "")
        lines.append(f"| {ctx} | {r['q']} | {r['s']} | {r['impl']} | {cell(r, 'burst')} | "
                     f"{cell(r, 'first', clock=False)} | {cell(r, 'sustained')} | {ratio} |")
    return "\n".join(lines)


def variants_table(rows: list[dict], names: list[str]) -> str:
    """Markdown: per shape, each pallas config's ms (% of floor), the fastest, its speedup over names[0]."""
    out = ["| ctx | Q | S | " + " | ".join(names) + " | fastest | vs " + names[0] + " |",
           "|---:|---:|---:|" + "---:|" * len(names) + "---|---:|"]
    key = lambda r: (r["ctx"], r["q"], r["s"], r.get("lengths", "uniform"))  # noqa: E731
    for shape in sorted({key(r) for r in rows}):
        by_name = {r["impl"][7:]: r for r in rows if key(r) == shape and r["impl"].startswith("pallas")}
        cells = [f"{by_name[n]['ms']:.3f} ({by_name[n]['pct_floor']:.0f}%)" if "ms" in by_name.get(n, {})
                 else ("error" if n in by_name else "-") for n in names]
        timed = [n for n in names if "ms" in by_name.get(n, {})]
        if not timed:
            continue
        best = min(timed, key=lambda n: by_name[n]["ms"])
        base = by_name.get(names[0], {})
        gain = f"{base['ms'] / by_name[best]['ms']:.2f}x" if "ms" in base else "-"
        ctx = f"{shape[0]}" + (" spread" if shape[3] == "spread" else "")
        out.append(f"| {ctx} | {shape[1]} | {shape[2]} | " + " | ".join(cells) + f" | {best} | {gain} |")
    return "\n".join(out)
