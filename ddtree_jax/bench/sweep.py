"""The speculative decoding sweep (experiments/speculative_sweep.py): the pair and prompts a config
names, its grid of points, one point's decode and record (the greedy check against ar's tokens
included) and the crash-safe run over every unfinished point.

A point decodes every held-out prompt (config.batches 0: ceil(prompts / streams) batches, the last
one filled by cycling the prompts) or a stated sample (config.batches > 0 batches), each batch
timed config.timing_reps times; its tokens/s is the median over the repetitions of (tokens / the
repetition's decode seconds summed over the batches), with the lowest and highest beside it. It
runs at config.matmul_precision ("auto": "highest", true float32, for a float32 pair; JAX's default
otherwise, which a GPU may run as TF32 or bf16 passes). Its record carries its parameters (the
resume key: repository-relative paths, backend and device kind, dtype and matmul precision
included), the run's commit, library versions and config name, and the metrics of
ddtree_jax.metrics over all its streams."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import xla_bridge

import ddtree_jax as dj
from ddtree_jax import budget as budgets
from ddtree_jax import engine, metrics, progress, serving
from ddtree_jax.checks import check_int, is_int
from ddtree_jax.bench import auto_budget, parity, record, sweep_io


def load_config(name: str):
    """get_config() of the repository's configs/<name>.py (sweep configs build on one another
    with it: configs/sweep_h200.py starts from load_config("sweep_default"))."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(record.ROOT, "configs", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def load_pair(cfg):
    """-> (target, drafter, prompts, pair id). Random tiny pair with random prompts, or the pair on
    disk with the held-out prompts (token ids)."""
    if cfg.random_tiny:
        tcfg = dj.ModelConfig.preset("tiny").replace(vocab_size=cfg.random_vocab)
        dcfg = dj.DrafterConfig.for_target(tcfg, block_size=cfg.block_size)
        dtype = jnp.dtype(cfg.dtype)
        target = (tcfg, dj.init_target(tcfg, jax.random.key(cfg.seed), dtype=dtype))
        drafter = (dcfg, dj.init_drafter(dcfg, jax.random.key(cfg.seed + 1), dtype=dtype))
        rng = np.random.default_rng(cfg.seed)
        n = max(cfg.streams) * max(cfg.batches, 1)
        prompts = [rng.integers(0, cfg.random_vocab, cfg.prompt_len or 32).tolist() for _ in range(n)]
        return target, drafter, prompts, f"random_tiny(v{cfg.random_vocab},b{cfg.block_size},s{cfg.seed})"
    from ddtree_jax.training import data
    target = dj.load_target(cfg.target_dir, dtype=jnp.dtype(cfg.dtype))
    drafter = dj.load_drafter(cfg.drafter_dir, dtype=jnp.dtype(cfg.dtype))
    prompts = [p[:cfg.prompt_len] if cfg.prompt_len else p for p in data.load_prompts(cfg.prompts)]
    return target, drafter, prompts, f"{repo_relative(cfg.target_dir)}|{repo_relative(cfg.drafter_dir)}"


def repo_relative(path: str) -> str:
    """`path` relative to the repository when inside it (a resume key survives moving the
    checkout), else absolute."""
    full = os.path.abspath(path)
    return os.path.relpath(full, record.ROOT) if full.startswith(record.ROOT + os.sep) else full


def matmul_precision(cfg) -> str:
    """config.matmul_precision, "auto" resolved: "highest" (true float32) for a float32 pair,
    "default" (JAX's: on a GPU possibly TF32 or bf16 passes) otherwise."""
    prec = cfg.get("matmul_precision", "auto")
    if prec == "auto":
        return "highest" if jnp.dtype(cfg.dtype) == jnp.float32 else "default"
    if prec not in MATMUL_PRECISIONS:
        raise ValueError(f"config.matmul_precision must be 'auto' or one of {MATMUL_PRECISIONS}; got {prec!r}")
    return prec


MATMUL_PRECISIONS = ("default", "high", "highest", "bfloat16", "tensorfloat32", "float32")


def grid(cfg, pair_id: str) -> list[dict]:
    """Point parameters in run order: per (temperature, streams) ar first (the speedup baseline).
    The JAX backend and device kind are parameters too, so a results file from another machine
    is not resumed from."""
    loop = cfg.get("decode_loop", "auto")
    if cfg.requests and loop != "auto":
        raise ValueError(f"config.decode_loop={loop!r} sets how static batches decode; with "
                         f"config.requests={cfg.requests} serving.serve runs its own loop: leave it 'auto'")
    check_config(cfg)
    points = []
    device = dict(backend=jax.default_backend(), device_kind=jax.devices()[0].device_kind)
    for temp in cfg.temperatures:
        for s in cfg.streams:
            base = dict(device, pair=pair_id, dtype=jnp.dtype(cfg.dtype).name,
                        matmul_precision=matmul_precision(cfg), streams=int(s), temperature=float(temp), seed=cfg.seed,
                        max_new_tokens=cfg.max_new_tokens, batches=cfg.batches, top_k=cfg.top_k,
                        top_p=cfg.top_p, steps_per_call=cfg.steps_per_call,
                        timing_reps=cfg.timing_reps, xla_flags=cfg.xla_flags,
                        requests=cfg.requests, decode_loop=loop,
                        drafter_attn_impl=cfg.get("drafter_attn_impl", "auto"),
                        attn_balance=bool(cfg.get("attn_balance", True)))
            methods = [(m, None) for m in ("dflash",) if m in cfg.methods]
            if "ddtree" in cfg.methods:   # the budgets, and each shared total's uniform split
                methods += [("ddtree", int(b)) for b in cfg.budgets]
                methods += [("ddtree", int(n) // s) for n in shared_totals(cfg)
                            if n >= s and n % s == 0 and ("ddtree", int(n) // s) not in methods]
            if "ddtree-auto" in cfg.methods:
                methods.append(("ddtree-auto", None))
            points.append(dict(base, method="ar", budget=None, steps_per_call=ar_steps_per_call(cfg)))
            points += [dict(base, method=m, budget=b) for m, b in methods]
            cap = cfg.get("shared_cap", 0)
            if "ddtree-shared" in cfg.methods:
                points += [dict(base, method="ddtree-shared", budget=cap, shared_budget=int(n))
                           for n in shared_totals(cfg)]
            if "ddtree-shared-auto" in cfg.methods:
                points.append(dict(base, method="ddtree-shared-auto", budget=cap))
    return points


def shared_totals(cfg) -> tuple[int, ...]:
    """The config's shared budgets (config.shared_budgets; absent in older configs: none)."""
    return tuple(cfg.get("shared_budgets", ()))


SWEEP_METHODS = ("ar", "dflash", "ddtree", "ddtree-auto", "ddtree-shared", "ddtree-shared-auto")
SHARED_METHODS = ("ddtree-shared", "ddtree-shared-auto")


def check_config(cfg) -> None:
    """ValueError naming the config field (config.methods, .streams, .budgets, .shared_budgets,
    .shared_cap, .temperatures, .max_new_tokens, .batches) whose value the sweep cannot run: an
    unknown method, an empty list, a count below 1, a negative temperature."""
    unknown = [m for m in cfg.methods if m not in SWEEP_METHODS]
    if unknown or not cfg.methods:
        raise ValueError(f"config.methods must name methods from {SWEEP_METHODS}; got "
                         f"{tuple(cfg.methods)} ({unknown or 'empty'})")
    shared = any(m in cfg.methods for m in SHARED_METHODS)
    lists = {"streams": tuple(cfg.streams), "budgets": tuple(cfg.budgets),
             "shared_budgets": shared_totals(cfg)}
    # ddtree's budgets may be left empty when the shared budgets give its points (their splits)
    needed = {"streams": True, "budgets": "ddtree" in cfg.methods and not lists["shared_budgets"],
              "shared_budgets": shared}
    for field, values in lists.items():
        if needed[field] and (not values or not all(is_int(v) and v >= 1 for v in values)):
            raise ValueError(f"config.{field} must be a non-empty list of ints >= 1; got {values}")
    if shared:
        check_int("config.shared_cap", cfg.get("shared_cap"), 1)
    temps = tuple(cfg.temperatures)
    if not temps or not all(isinstance(t, (int, float)) and not isinstance(t, bool) and t >= 0
                            for t in temps):
        raise ValueError(f"config.temperatures must be a non-empty list of numbers >= 0; got {temps}")
    check_int("config.max_new_tokens", cfg.max_new_tokens, 1)
    check_int("config.batches", cfg.batches, 0)
    check_int("config.timing_reps", cfg.timing_reps, 1)


def ar_steps_per_call(cfg) -> int:
    """Engine steps per dispatch for the ar baseline: cfg.ar_steps_per_call, else steps_per_call."""
    return int(cfg.get("ar_steps_per_call", 0) or cfg.steps_per_call)


def _batches(prompts, streams: int, batches: int):
    """`batches` batches of `streams` prompts (0: enough to decode every prompt), prompts cycled."""
    batches = batches or -(-len(prompts) // streams)
    n = streams * batches
    cycled = [prompts[i % len(prompts)] for i in range(n)]
    return [cycled[i * streams:(i + 1) * streams] for i in range(batches)]


def _served(prompts, requests: int):
    return [prompts[i % len(prompts)] for i in range(requests)]


def acceptance_stats(results) -> dict:
    """The verified-node accounting of GenerateResults (`generate`'s, one per batch, or `serve`'s):
    tokens_per_step = emitted tokens / steps (all streams of a step together; the steps of the
    batches summed); tokens_per_full_step: the same over the steps in which every stream of a
    static batch is active (the tail where only the slowest streams still run left out; served:
    None, its steps are not aligned); tokens_per_verified = emitted tokens / verified tokens (each
    active stream's root and draft nodes); tau_per_stream [batch][stream] (served: [1][request]);
    acceptance_lengths and tree_nodes [batch][stream][step]: each stream's emitted tokens and
    verified draft nodes per step (a static batch's streams start together, so index i of every
    stream is the batch's step i)."""
    acc = [a for r in results for row in r.acceptance_lengths for a in row]
    full = [sum(row[i] for row in r.acceptance_lengths) for r in results if r.request_seconds is None
            for i in range(min(map(len, r.acceptance_lengths)))]
    return dict(tokens_per_step=sum(acc) / max(1, sum(r.steps for r in results)),
                tokens_per_full_step=float(np.mean(full)) if full else None,
                tokens_per_verified=metrics.accepted_per_verified(
                    [row for r in results for row in r.acceptance_lengths],
                    [[n + 1 for n in row] for r in results for row in r.tree_nodes]),
                tau_per_stream=[[float(np.mean(row)) if row else 0.0 for row in r.acceptance_lengths]
                                for r in results],
                acceptance_lengths=[r.acceptance_lengths for r in results],
                tree_nodes=[r.tree_nodes for r in results])


def _generate(target, drafter, prompts, batches, p: dict, budget: int, cfg, shared=None) -> dict:
    """Run every prompt batch (static batches), or serve p["requests"] requests through
    p["streams"] slots (continuous batching, `prompts` cycled); tau over all (stream, step) pairs,
    tokens/s = tokens / decode time, `acceptance_stats`; "tokens": the generated ids per batch
    (served: one batch of every request), per stream. shared: the engine's shared_budget (an int,
    or a step-time curve over shared totals)."""
    kw = dict(method=p["method"].split("-")[0], budget=budget, shared_budget=shared,
              max_new_tokens=p["max_new_tokens"], temperature=p["temperature"], top_k=p["top_k"],
              top_p=p["top_p"], seed=p["seed"], steps_per_call=p["steps_per_call"],
              drafter_attn_impl=p["drafter_attn_impl"], attn_balance=p.get("attn_balance", True))
    if p["requests"]:   # served timing_reps times, each from the start (the same tokens each time)
        runs = [serving.serve(target, drafter, _served(prompts, p["requests"]), streams=p["streams"], **kw)
                for _ in range(p["timing_reps"])]
        if any(x.tokens != runs[0].tokens for x in runs):
            raise RuntimeError(f"{p['method']} at {p['streams']} streams: the timed serving runs "
                               f"(timing_reps) gave different tokens")
        r = dataclasses.replace(runs[0], decode_times=[x.decode_seconds for x in runs])
        stage = {}   # the breakdown comes from a static batch
        if cfg.stage_reps:
            stage = engine.generate(target, drafter, batches[0], stage_reps=cfg.stage_reps,
                                    **kw).stage_times
        lat = np.asarray(r.request_seconds)
        per_request = np.asarray([len(t) - 1 for t in r.tokens]) / lat
        return dict(tau=r.tau, generated=sum(len(t) - 1 for t in r.tokens),
                    compile_seconds=r.compile_seconds, steps=r.steps, device_steps=r.device_steps,
                    stage_times=stage, request_p50_s=float(np.median(lat)), request_p90_s=float(np.quantile(lat, 0.9)),
                    request_tokens_per_second=float(per_request.mean()), tokens=[r.tokens],
                    **timing([r]), **acceptance_stats([r]), metrics=point_metrics([r]))
    results, stage = [], None
    for batch in batches:
        r = engine.generate(target, drafter, batch, stage_reps=cfg.stage_reps if stage is None else 0,
                            timing_reps=p["timing_reps"], decode_loop=p["decode_loop"], **kw)
        results.append(r)
        stage = r.stage_times if stage is None else stage
    acc = [a for r in results for row in r.acceptance_lengths for a in row]
    return dict(tau=float(np.mean(acc)), generated=sum(len(t) - 1 for r in results for t in r.tokens),
                compile_seconds=sum(r.compile_seconds for r in results),
                steps=sum(r.steps for r in results),
                device_steps=sum(r.device_steps for r in results), stage_times=stage,
                loop=results[-1].decode_loop, tokens=[r.tokens for r in results],
                **timing(results), **acceptance_stats(results), metrics=point_metrics(results))


def timing(results) -> dict:
    """tokens/s of a point's GenerateResults (one per batch, each timed len(decode_times) times):
    repetition i's rate = generated tokens / the batches' i-th decode seconds summed;
    tokens_per_second the median rate, tokens_per_second_range [lowest, highest], decode_seconds
    the median summed seconds."""
    reps = min(len(r.decode_times) for r in results)
    tokens = sum(len(t) - 1 for r in results for t in r.tokens)
    totals = np.array([sum(r.decode_times[i] for r in results) for i in range(reps)])
    rates = tokens / totals if tokens else np.zeros(reps)
    return dict(tokens_per_second=float(np.median(rates)),
                tokens_per_second_range=[float(rates.min()), float(rates.max())],
                decode_seconds=float(np.median(totals)))


def point_metrics(results) -> dict:
    """ddtree_jax.metrics.summary over every stream (or request) of a point's GenerateResults:
    acceptance rate by depth, acceptance histogram, accepted per verified token (each step's real
    draft nodes + 1), TTFT and TPOT percentiles (a static batch's streams timed from its own start;
    served requests from the first prefill's)."""
    rows = [row for r in results for row in r.acceptance_lengths]
    verified = [[n + 1 for n in row] for r in results for row in r.tree_nodes]
    first = [t for r in results for t in r.first_token_seconds]
    last = [t for r in results for t in r.last_token_seconds]
    return metrics.summary(rows, results[0].max_accept_length, verified,
                           [t for r in results for t in r.tokens], first, last)


def _group(p: dict, **changes) -> str:
    """The key of the point of p's group (same streams, temperature, ...) with `changes`; a shared
    point's shared_budget is not a group parameter."""
    return sweep_io.point_key(dict({k: v for k, v in p.items() if k != "shared_budget"}, **changes))


def check_greedy(target, prompts, batches, p: dict, rec: dict, ar: dict | None) -> int:
    """A temperature-0 speculative point's tokens against its group's ar point's, batch by batch
    (parity.check_greedy); -> streams that left ar's tokens at a near-tie."""
    what = f"{p['method']}{'@' + sweep_io.budget_cell(rec) if rec['budget'] else ''} at {p['streams']} streams"
    if not ar or "tokens" not in ar:
        raise ValueError(f"{what}, temperature 0: its tokens are checked against the ar point of its "
                         f"group, which is not in the results log (grid runs it first)")
    groups = [_served(prompts, p["requests"])] if p["requests"] else batches
    return sum(parity.check_greedy(target, g, want, got, f"{what}, batch {b}")
               for b, (g, want, got) in enumerate(zip(groups, ar["tokens"], rec["tokens"])))


def _curve(log, p: dict, method: str, xs, key: str) -> budgets.StepTimeCurve | None:
    """The step-time curve of the group's finished `method` points at x values `xs` (their field
    `key`: "budget" or "shared_budget"), from their "step" stage times; None below 2 of them."""
    fixed = [log.records.get(_group(p, method=method, **{key: int(x)})) for x in xs]
    fixed = [r for r in fixed if r and "step" in (r["stage_times"] or {})]
    if len(fixed) < 2:
        return None
    return budgets.StepTimeCurve(tuple(r[key] for r in fixed), tuple(r["stage_times"]["step"] for r in fixed))


def run_point(target, drafter, prompts, p: dict, log: sweep_io.ResultsLog, cfg) -> dict:
    """One point -> its record (parameters, key, measurements), at the point's matmul precision.
    "ddtree-auto" picks its budget for the run, "ddtree-shared-auto" hands the engine a step-time
    curve over shared totals (each step picks its own total): both from the group's fixed points'
    step times, or measured afresh."""
    with jax.default_matmul_precision(p["matmul_precision"]):
        return _run_point(target, drafter, prompts, p, log, cfg)


def _run_point(target, drafter, prompts, p: dict, log: sweep_io.ResultsLog, cfg) -> dict:
    t0 = time.perf_counter()
    batches = _batches(prompts, p["streams"], p["batches"])
    extra, budget, shared = {}, p["budget"] or 1, p.get("shared_budget")
    measure = dict(temperature=p["temperature"], max_new_tokens=p["max_new_tokens"], seed=p["seed"])
    if p["method"] == "ddtree-auto":
        curve = _curve(log, p, "ddtree", cfg.budgets, "budget") or auto_budget.measure_step_times(
            target, drafter, batches[0], cfg.budgets, steps_per_call=p["steps_per_call"], **measure)
        choice = auto_budget.choose_budget(target, drafter, batches[0], curve, steps=cfg.auto_steps,
                                           **measure)
        budget = choice.budget
        extra = dict(expected_tau=choice.expected_tau, curve_budgets=list(curve.budgets),
                     curve_seconds=list(curve.seconds), choose_seconds=time.perf_counter() - t0)
    elif p["method"] == "ddtree-shared-auto":
        shared = _curve(log, p, "ddtree-shared", shared_totals(cfg), "shared_budget") or \
            auto_budget.measure_step_times(target, drafter, batches[0], shared_totals(cfg),
                                           shared_cap=budget, steps_per_call=p["steps_per_call"],
                                           **measure)
        extra = dict(curve_budgets=list(shared.budgets), curve_seconds=list(shared.seconds),
                     choose_seconds=time.perf_counter() - t0)
    rec = dict(p, key=sweep_io.point_key(p), **extra,
               **_generate(target, drafter, prompts, batches, p, budget, cfg, shared))
    rec["budget"] = budget if p["method"].startswith("ddtree") else None
    ar = log.records.get(_group(p, method="ar", budget=None, steps_per_call=ar_steps_per_call(cfg)))
    if p["temperature"] == 0 and p["method"] != "ar":   # lossless, or no numbers
        rec["greedy_ties"] = check_greedy(target, prompts, batches, p, rec, ar)
    if p["method"] != "ar" or p["temperature"] != 0:   # ar's temperature-0 records keep them for
        del rec["tokens"]                              # the later points, this run's or a resumed one's
    base = rec["tokens_per_second"] if p["method"] == "ar" else (ar or {}).get("tokens_per_second")
    rec.update(speedup=rec["tokens_per_second"] / base if base else None,
               wall_seconds=time.perf_counter() - t0,
               finished=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    return rec


def run_sweep(cfg, config_name: str = "", show_progress: bool = True) -> list[dict]:
    """Run every unfinished point of the config's grid, with a progress bar and ETA on a terminal
    (ddtree_jax.progress; show_progress False: none); -> all records of the grid. Each new record
    also carries the run's commit, library versions and `config_name` (the config file)."""
    target, drafter, prompts, pair_id = load_pair(cfg)
    info = record.run_info("speculative_sweep")
    run = dict(commit=info["commit"], versions=info["versions"], config=config_name)
    log = sweep_io.ResultsLog(os.path.join(cfg.out_dir, "results.jsonl"))
    points = grid(cfg, pair_id)
    todo = [p for p in points if sweep_io.point_key(p) not in log]
    print(f"pair {pair_id} on {jax.default_backend()}: {len(points)} points, "
          f"{len(points) - len(todo)} already in {log.path}", flush=True)
    for i, p in enumerate(progress.track(todo, "sweep points", show_progress)):
        rec = run_point(target, drafter, prompts, p, log, cfg)
        log.append(dict(rec, **run))
        print(f"[{i + 1}/{len(todo)}] streams {p['streams']} T {p['temperature']:g} {p['method']}"
              f"{'@' + sweep_io.budget_cell(rec) if rec['budget'] else ''}: tau {rec['tau']:.2f}, "
              f"{rec['tokens_per_second']:.1f} tok/s, {rec['wall_seconds']:.1f} s", flush=True)
    records = [log.records[sweep_io.point_key(p)] for p in points]
    for temp in cfg.temperatures:
        sweep_io.plot_sweep(records, os.path.join(cfg.out_dir, f"sweep_T{float(temp):g}.png"), float(temp))
        if any(r["method"] in SHARED_METHODS for r in records):
            sweep_io.plot_shared(records, os.path.join(cfg.out_dir, f"shared_T{float(temp):g}.png"),
                                 float(temp))
    return records


def add_xla_flags(xla_flags: str) -> None:
    """Append `xla_flags` to XLA_FLAGS, which XLA reads once, when the backend starts; ValueError
    if it has started already (an import that ran a computation), where they would be ignored."""
    # private, but present in jax 0.10.2 and 0.11.2
    if xla_bridge.backends_are_initialized():
        raise ValueError(f"config.xla_flags={xla_flags!r} cannot apply: the JAX backend started "
                         "before the sweep could set XLA_FLAGS; set XLA_FLAGS in the environment")
    os.environ["XLA_FLAGS"] = " ".join(f for f in (os.environ.get("XLA_FLAGS"), xla_flags) if f)
