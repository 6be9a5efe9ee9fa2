"""Kimi K2.6 projection support (experiments/k2_projection.py): the tau curve it assumes, the
roofline's best budget per GPU type and calibration, its checks against the published Kimi K2.6
numbers on 8 RTX PRO 6000, and the measured verify-step parts of a target preset on this machine."""

from __future__ import annotations

import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np

import ddtree_jax as dj
from ddtree_jax.bench import calibration
from ddtree_jax.bench import roofline as rf
from ddtree_jax.bench import sweep_io
from ddtree_jax.bench import timing
from ddtree_jax.bench.timing import median_seconds, stream_contexts
from ddtree_jax.progress import track
from ddtree_jax.model import aligned_slots
from pallas_kernels.mla_attention import mla_attention, visibility_to_mask
from pallas_kernels.moe import moe_experts


# Published Kimi K2.6 numbers on 8 RTX PRO 6000 Blackwell
PUBLISHED = dict(moe_gb=8.5, moe_ms=7.0, per_token_us_1=150.0, per_token_us_256=6.85,
                 ddtree_tps_1=138.7, ddtree_tps_10=517.0)


def tau_curve(tau: str = "", tau_jsonl: str = "") -> rf.TauCurve:
    """tau(budget): parsed from 'budget:tau,...', else from sweep results (ddtree, temperature 0,
    the fewest streams), else roofline.DEFAULT_TAU."""
    if tau:
        return rf.TauCurve.parse(tau)
    if tau_jsonl:
        recs = [r for r in sweep_io.read_results(tau_jsonl)
                if r["method"] == "ddtree" and r["temperature"] == 0]
        s = min(r["streams"] for r in recs)
        pts = sorted((r["budget"], r["tau"]) for r in recs if r["streams"] == s)
        return rf.TauCurve(tuple(b for b, _ in pts), tuple(t for _, t in pts))
    return rf.DEFAULT_TAU


def published_checks(dep: rf.Deployment, tau: rf.TauCurve) -> list[dict]:
    """Projection vs each published RTX PRO 6000 number: model value, ratio, the reason."""
    gpu, cfg, rows = rf.GPUS["RTX PRO 6000"], dep.model, []
    for cal in calibration.calibrations().values():
        moe1 = lambda t, g: rf.moe_seconds(gpu, cal, cfg, t, g)
        add = lambda what, model, pub, why: rows.append(dict(calibration=cal.name, check=what, model=model,
                                                             published=pub, ratio=model / pub, why=why))
        add("MoE layer, all experts (T=256, 1 GPU), ms", moe1(256, 1) * 1e3, PUBLISHED["moe_ms"],
            "model streams 9.5 GB (INT4 + bf16 scales; the quoted 8.5 GB is the nibbles alone) at the "
            "calibration's fraction of 1.6 TB/s copy")
        add("MoE per-token cost at T=1 (1 GPU), us", moe1(1, 1) * 1e6, PUBLISHED["per_token_us_1"],
            f"8 experts = 198 MB, at least {cal.moe_min_us:.0f} us ({cal.name}'s latency floor, "
            f"on the H200)")
        add("MoE per-token cost at T=256 (1 GPU), us", moe1(256, 1) / 256 * 1e6,
            PUBLISHED["per_token_us_256"], "one GPU must stream all 9.5 GB: >= 5.3 us/token at peak, so "
            "the quote cannot be one GPU's whole layer")
        add("MoE per-token cost at T=256 (8 GPUs), us", moe1(256, 8) / 256 * 1e6,
            PUBLISHED["per_token_us_256"], "EP8 reading: each GPU streams 1/8 of the experts; the quote "
            "sits between the 1- and 8-GPU readings (setup not stated)")
        for s, key in ((1, "ddtree_tps_1"), (10, "ddtree_tps_10")):
            b = rf.best(rf.project(gpu, cal, dep, tau, s))
            implied = PUBLISHED[key] * b["step_ms"] * 1e-3 / s
            add(f"DDTree tok/s at {s} stream(s), best budget {b['budget']}", b["tokens_per_second"],
                PUBLISHED[key], f"assumed tau {b['tau']:.2f}; the published rate at this step time "
                f"({b['step_ms']:.1f} ms) implies tau {implied:.2f}; the service's tau, budget and "
                f"context are not published")
    return rows


CHECK_TOL = 1e-2     # relative error of the timed kernels against the xla path (bf16: 2-3e-3 measured)


def check_against_xla(what: str, fn, ref_fn, *args) -> None:
    """Raise unless fn(*args) matches the xla path's ref_fn(*args) to CHECK_TOL (relative norm)."""
    out, ref = (np.asarray(f(*args), np.float64) for f in (fn, ref_fn))
    err = np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30)
    if not np.isfinite(err) or err > CHECK_TOL:
        raise AssertionError(f"{what}: relative error {err:.2e} against the xla path > {CHECK_TOL:.0e}")


def part_seconds(fn, *args, reps: int) -> tuple[float, str]:
    """(seconds per call, clock) of one part of the forward (attention, MoE, head): on a GPU its
    kernels' device time from a profiler trace, as they run inside the forward ("device");
    elsewhere the wall clock's median over reps ("wall"). On the H200 a wall clock of one call per
    round added the host's dispatch and sync, 0.1-0.4 ms, to 0.2-1.1 ms attention calls at 16k
    (docs/kernels/mla_attention.md)."""
    if jax.default_backend() == "gpu" and (traced := timing.traced_device_time(fn, *args,
                                                                                    calls=max(reps, 10))):
        return traced["busy_us"] * 1e-6, "device"
    return median_seconds(fn, *args, reps=reps), "wall"


def measure(cfg: dj.ModelConfig, budgets, streams, ctx: int, dtype=jnp.bfloat16, reps: int = 5,
            ceilings: dict | None = None, lengths=("uniform",), balances=(True,),
            progress: bool = True) -> list[dict]:
    """Per (streams, budget, lengths, attn_balance): seconds of the forward (wall clock), and per
    layer of attention / MoE / rest (`part_seconds`: on a GPU device time, parts_clock "device");
    the attention and MoE kernels are checked against the xla path first.
    lengths: the streams' contexts (timing.stream_contexts: all ctx, or "spread" from ctx / S
    to ~2 ctx, the same total); balances: the forward's attn_balance values to time (the
    attention's balance hint). ceilings (timing.measure_ceilings, this run): also each
    kernel's share of its roofline floor (from ctx: the spread's total is the same). progress: a
    bar on a terminal (ddtree_jax.progress)."""
    params = dj.init_target(cfg, jax.random.key(0), dtype=dtype)
    moe_layers = [i for i in range(cfg.num_hidden_layers) if cfg.is_moe_layer(i)]
    experts = params[f"layers_{moe_layers[0]}"]["mlp"]["experts"]
    head = params["lm_head"]["kernel"]
    dk, h = cfg.latent_dim, cfg.num_attention_heads
    attend, moe = mla_attention, moe_experts
    attend_xla = functools.partial(mla_attention, impl="xla")
    moe_xla = functools.partial(moe_experts, impl="xla")
    if ceilings:    # the roofline's H200 with this run's measured copy and matmul rates
        gpu = dataclasses.replace(rf.GPUS["H200"], copy_tbs=ceilings["copy_tbps"],
                                  bf16_tflops=max(ceilings["matmul_tflops_xla"], ceilings["matmul_tflops_torch"]))
    rng = np.random.default_rng(0)
    rows, per_tokens = [], {}
    points = list(itertools.product(streams, budgets, lengths, balances))
    for s, b, kind, bal in track(points, "forward", progress):
        q, t = b + 1, s * (b + 1)
        contexts = jnp.asarray(stream_contexts(ctx, s, kind), jnp.int32)
        cache = dj.init_cache(cfg, s, aligned_slots(int(contexts.max()) + q), dtype)   # as engine.setup allocates
        cache = cache.replace(kv=tuple(jnp.asarray(rng.normal(0, 1, k.shape), dtype) for k in cache.kv),
                              lengths=contexts)
        tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (s, q)), jnp.int32)
        pos = contexts[:, None] + jnp.arange(q, dtype=jnp.int32)
        # the tree: a chain (the kernels' cost does not depend on which nodes a node sees)
        vis = jnp.broadcast_to(jnp.tril(jnp.ones((q, q), bool)), (s, q, q))
        fwd = jax.jit(lambda p, c: dj.forward(p, cfg, tokens, pos, c, visibility=vis, attn_balance=bal).logits)
        what = f"streams {s}, budget {b}, {kind} contexts, attn_balance {bal}"
        if not bool(jnp.isfinite(fwd(params, cache)).all()):
            raise AssertionError(f"forward at {what}: non-finite logits")
        t_full = median_seconds(fwd, params, cache, reps=reps)
        qa = jnp.asarray(rng.normal(0, 1, (s, q, h, dk)), dtype)
        mask = visibility_to_mask(vis)
        kw = dict(scale=cfg.softmax_scale, v_dim=cfg.kv_lora_rank)
        att = jax.jit(lambda qq, kv: attend(qq, kv, cache.lengths, mask, balance=bal, **kw))
        check_against_xla(f"attention at {what}", att,
                 lambda qq, kv: attend_xla(qq, kv, cache.lengths, mask, **kw), qa, cache.kv[0])
        t_attn, clock = part_seconds(att, qa, cache.kv[0], reps=reps)
        if t not in per_tokens:     # MoE and head: by token count only (not the contexts or the hint)
            x = jnp.asarray(rng.normal(0, 1, (t, cfg.hidden_size)), dtype)
            ids = np.argsort(rng.random((t, cfg.n_routed_experts)), 1)[:, :cfg.num_experts_per_tok]
            ids = jnp.asarray(ids, jnp.int32)
            w = jnp.full(ids.shape, 1.0 / cfg.num_experts_per_tok, jnp.float32)
            check_against_xla(f"MoE at {t} tokens", jax.jit(moe), jax.jit(moe_xla), x, ids, w, experts)
            logits = jax.jit(lambda xx, hh: jnp.dot(xx, hh, preferred_element_type=jnp.float32))
            per_tokens[t] = (part_seconds(jax.jit(moe), x, ids, w, experts, reps=reps),
                             part_seconds(logits, x, head, reps=reps))
        (t_moe, moe_clock), (t_head, head_clock) = per_tokens[t]
        n = cfg.num_hidden_layers
        rest = (t_full - n * t_attn - len(moe_layers) * t_moe - t_head) / n
        row = dict(streams=s, budget=b, tokens=t, ctx=ctx, lengths=kind, attn_balance=bal,
                   forward_ms=t_full * 1e3, attention_ms=t_attn * 1e3, moe_ms=t_moe * 1e3, rest_ms=rest * 1e3,
                   head_ms=t_head * 1e3,
                   parts_clock="/".join(sorted({clock, moe_clock, head_clock})))
        if ceilings:
            row.update(moe_pct_floor=100 * rf.moe_seconds(gpu, rf.UNIT, cfg, t, 1) / t_moe,
                       attn_pct_floor=100 * rf.attention_seconds(gpu, rf.UNIT, cfg, s, q, ctx, 1) / t_attn)
        rows.append(row)
    return rows


def best_budgets(dep: rf.Deployment, tau: rf.TauCurve, gpus, calibrations, streams) -> tuple[list, list]:
    """Per (GPU type, calibration, stream count): the roofline over the budgets (rf.project) and
    its best budget, with ar's tokens/s (the budget-0 row), the speedup over it and each part's ms
    per step; -> (every projected row, the best rows)."""
    projection, best = [], []
    for name in gpus:
        for cal in calibrations:
            for s in streams:
                rows = rf.project(rf.GPUS[name], calibration.calibrations()[cal], dep, tau, s)
                projection += rows
                b = dict(rf.best(rows), ar_tokens_per_second=rows[0]["tokens_per_second"])
                b["speedup_over_ar"] = b["tokens_per_second"] / rows[0]["tokens_per_second"]
                b.update({f"{k}_ms": v for k, v in b["parts_ms"].items()})
                best.append(b)
    return projection, best
