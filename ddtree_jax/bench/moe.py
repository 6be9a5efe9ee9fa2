"""Routed-expert MoE kernel benchmark support (experiments/kernel_bench.py --op=moe): the
implementations timed at the Kimi-K2 layer shape against the float64 golden, the --variants option
sets and the tuned config's neighbours, the device-time split into GEMM kernels and glue, and the
tables the benchmark prints."""

from __future__ import annotations

import dataclasses
import json
import time

import numpy as np

from ddtree_jax.bench import timing
from ddtree_jax.progress import track

IMPLS = ("pallas_triton", "triton", "xla", "ragged_dot", "bf16_weights", "variants", "triton_variants")


@dataclasses.dataclass(frozen=True)
class Options:
    """What a `bench_moe` run takes (kernel_bench.py's flags of the same names say what each does)."""

    tokens: tuple[int, ...] = (1, 4, 16, 64, 256, 1024, 4096)
    impls: tuple[str, ...] = IMPLS[:5]
    experts: int = 384
    hidden: int = 7168
    inter: int = 2048
    topk: int = 8
    scale_dtype: str = "bfloat16"
    sweep: bool = True
    min_time_s: float = 0.15
    load_s: float = 0.0
    idle_s: float = 2.0
    warm_s: float = 1.0
    variants: str = ""
    budget_s: float = 0.0
    trace: bool = False
    progress: bool = True        # a bar per implementation on a terminal (ddtree_jax.progress)

# Why the xla path gets no load profile: its call launches 154-10,100 kernels (a scan over the row
# blocks), and its profiler traces do not come back: 24 calls at T = 256 (243k kernels) ran past
# 300 s to export, a 3 s load at T = 1 (about 420k) past 250 s, while
# dequantise-then-ragged_dot's 259k kernels took 20 s and the kernels' 207k 25 s.
XLA_NO_LOAD = ("not taken for the xla path: its 3 s trace (150-10,000 kernels per call) does not "
               "export in minutes")

# the two GEMM kernels of a traced moe call: raw Triton names, Pallas names
_GEMMS = {"gate_up": ("gate_up", "_gate_up_kernel"), "down": ("down", "_down_kernel")}


def kernel_split(top: list[dict], busy_us: float, gemm_bytes: dict, bw: float) -> dict:
    """A traced call's device time split into its GEMM kernels and the rest: {gate_up_us, down_us,
    glue_us, gate_up_pct_copy, down_pct_copy}, each kernel's % of copy bandwidth `bw` (bytes/s) by
    its own bytes (gemm_bytes {"gate_up": .., "down": ..}). top: the trace's kernels [{"name", "us"}]
    per call. {} unless each GEMM appears exactly once (another implementation's kernels)."""
    us = {}
    for part, names in _GEMMS.items():
        hits = [kk["us"] for kk in top if kk["name"] in names]
        if len(hits) != 1:
            return {}
        us[part] = hits[0]
    out = {f"{part}_us": v for part, v in us.items()}
    out["glue_us"] = busy_us - sum(us.values())
    out.update({f"{part}_pct_copy": 100 * gemm_bytes[part] / (v * 1e-6) / bw for part, v in us.items()})
    return out


def _time(call, min_time_s: float) -> float:
    """Median seconds per call: warm-up, then repeats of back-to-back async calls."""
    call().block_until_ready()
    t0 = time.perf_counter()
    call().block_until_ready()
    one = time.perf_counter() - t0
    n = int(min(50, max(2, min_time_s / 5 / max(one, 1e-6))))
    reps = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            out = call()
        out.block_until_ready()
        reps.append((time.perf_counter() - t0) / n)
    return float(np.median(reps))


def _routings(key, t, e, k, n):
    """n random routings [t, k] of distinct experts with normalised weights; rows 0..1 are fixed."""
    import jax
    import jax.numpy as jnp
    kid, kw = jax.random.split(key)
    ids = jnp.argsort(jax.random.uniform(kid, (n, t, e)), axis=-1)[..., :k].astype(jnp.int32)
    fixed = jnp.arange(2 * k, dtype=jnp.int32).reshape(2, k) * 7 % e
    ids = ids.at[:, : min(t, 2)].set(fixed[: min(t, 2)])
    w = jax.random.uniform(kw, (n, t, k), minval=0.1, maxval=1.0)
    return ids, (w / w.sum(-1, keepdims=True) * 2.827).astype(jnp.float32), fixed


def parse_variants(text: str) -> list[dict]:
    """'f=v,f=v;f=v' -> [{field: value}] of MoEConfig fields, values typed like the field's default.
    Raises ValueError naming the unknown field or the value that does not parse."""
    from pallas_kernels.moe.tuning import MoEConfig
    sets = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        opts = {}
        for item in filter(None, (i.strip() for i in part.split(","))):
            name, sep, value = item.partition("=")
            if not sep or name not in MoEConfig._fields:
                raise ValueError(f"--variants: {item!r} is not field=value of a MoEConfig field "
                                 f"({', '.join(MoEConfig._fields)})")
            kind = type(MoEConfig._field_defaults[name])
            if kind is bool:
                if value not in ("true", "false", "True", "False", "1", "0"):
                    raise ValueError(f"--variants: {name} needs true or false, got {value!r}")
                opts[name] = value in ("true", "True", "1")
            else:
                try:
                    opts[name] = kind(value)
                except ValueError:
                    raise ValueError(f"--variants: {name} needs a {kind.__name__}, got {value!r}") from None
        sets.append(opts)
    return sets


# MoEConfig fields the raw Triton kernels do not read (triton_impl.py): a variant setting one would
# time the tuned kernels under another name
RAW_IGNORED = ("swap_ab", "split_k", "cols_first")


def variant_cfgs(t: int, sets: list[dict] | None = None, raw: bool = False) -> list:
    """Experimental options on top of the tuned config for T (the plain tuned config is timed as
    pallas_triton with --sweep=false): `sets` when given, else the tuned config's one-knob
    neighbours (`_neighbour_sets`). raw (the raw Triton kernels, --impls=triton_variants): no set
    may set a RAW_IGNORED field (ValueError naming it), and the neighbours leave those fields out."""
    from pallas_kernels.moe import tuning
    base = tuning.config(t)
    if raw:
        for o in sets or ():
            if bad := sorted(set(o) & set(RAW_IGNORED)):
                raise ValueError(f"--variants: the raw Triton kernels ignore {', '.join(bad)} "
                                 "(time it with --impls=variants, the Pallas kernels)")
    if sets:
        return [base._replace(**o).check() for o in sets]
    return _neighbour_sets(base, t, skip=RAW_IGNORED if raw else ())


def _neighbour_sets(base, t: int, skip: tuple[str, ...] = ()) -> list:
    """The tuned config `base` with one knob moved: gate_up's tile halved and doubled, the down
    tile halved, one more pipeline stage, twice the warps, the weight tile on the MMA's M side, and
    at T <= 4 (few programs) K split 4 ways; those moving a field in `skip`, equal to `base` or that
    no kernel can run (MoEConfig.check) left out, each kept once."""
    opts = [dict(bn_up=max(16, base.bn_up // 2)), dict(bn_up=base.bn_up * 2),
            dict(bn_down=max(16, base.bn_down // 2)), dict(num_stages=base.num_stages + 1),
            dict(num_warps=base.num_warps * 2), dict(swap_ab=True)]
    if t <= 4:
        opts.append(dict(split_k=4))
    cfgs = []
    for o in (o for o in opts if not set(o) & set(skip)):
        cfg = base._replace(**o)
        try:
            cfg.check()
        except ValueError:
            continue
        if cfg != base and cfg not in cfgs:
            cfgs.append(cfg)
    return cfgs


def all_tokens_error(out, x, ids, w, experts) -> float:
    """Relative Frobenius error of a variant's whole output `out` [T, d] against the tuned config
    of the Pallas kernels with the integer dequantisation (no PTX), on the same inputs. The golden
    check covers 2 tokens; this covers every row block, so a layout-dependent fault confined to
    some blocks (the PTX dequantisation in 64-row blocks) cannot pass on the 2 tokens' luck."""
    import jax.numpy as jnp

    from pallas_kernels.moe import tuning
    from pallas_kernels.moe.pallas_triton import moe_experts_pallas

    ref = moe_experts_pallas(x, ids, w, experts, cfg=tuning.config(x.shape[0])._replace(dequant="bits"))
    ref, got = (np.asarray(a.astype(jnp.float32), np.float64) for a in (ref, out))
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref)) if np.all(np.isfinite(got)) else float("inf")


def _cfg_name(c, impl: str = "pallas_triton") -> str:
    """impl(bm, bn_up, bn_down, warps, stages, dequant[, options that are on])."""
    on = [f"{f}={getattr(c, f)}" for f in ("scale_weights", "swap_ab", "split_k", "down_warps",
                                           "down_stages", "cols_first", "min_bm", "f16")
          if getattr(c, f) != type(c)._field_defaults[f]]
    return f"{impl}{tuple(c)[:6] + tuple(on)}"


def _parts(t, cfg, e, k):
    """Stages of moe_experts_pallas under `cfg` (the bf16-compute form), each jitted alone:
    {name: fn(x, ids, w, experts)}."""
    import jax
    from pallas_kernels.moe import pallas_triton as pt
    from pallas_kernels.moe.align import align_routing
    from pallas_kernels.moe.experts import dims

    def routing(x, ids, w, ex):
        return align_routing(ids, e, cfg.bm)

    def gate_up(x, ids, w, ex):
        r = routing(x, ids, w, ex)
        return pt.gate_up(x, r.row_slot, r.block_expert, ex, dims(ex), cfg, k)

    def down(h, ids, w, ex):
        r = routing(h, ids, w, ex)
        return pt.down(h, r.row_slot, w.reshape(-1), r.block_expert, ex, dims(ex), cfg)

    def comb(y, ids, w, ex):
        return y.reshape(t, k, -1).sum(axis=1).astype(jax.numpy.bfloat16)

    return {"routing": jax.jit(routing), "gate_up": jax.jit(gate_up), "down": jax.jit(down),
            "combine": jax.jit(comb)}


def bench_moe(o: Options) -> dict:
    """The MoE table (experiments/kernel_bench.py's docstring), with the GPU's SM clock and power
    sampled throughout (timing.GpuClocks): each row's wall_clocks and trace_clocks."""
    with timing.GpuClocks() as clocks:
        return _bench_moe(o, clocks)


def _bench_moe(o: Options, clocks) -> dict:
    import jax
    import jax.numpy as jnp

    from pallas_kernels import moe, registry
    from pallas_kernels.moe import int4, tuning
    from pallas_kernels.moe.pallas_triton import moe_experts_pallas
    from pallas_kernels.moe.reference import dequantize_int4_reference, moe_experts_reference
    from pallas_kernels.moe.triton_impl import moe_experts_triton
    from pallas_kernels.moe.xla import moe_experts_xla

    ceil = timing.measure_ceilings(clocks)
    if o.load_s > 0:      # the copy ceiling in the same two regimes as the rows' load profiles
        ceil["copy_load"] = timing.sustained_copy(load_s=o.load_s, idle_s=o.idle_s, clocks=clocks)
    print("ceilings", ceil, flush=True)
    rate = max(ceil["matmul_tflops_torch"], ceil["matmul_tflops_xla"]) * 1e12
    bw = ceil["copy_tbps"] * 1e12
    e, d, i, k = o.experts, o.hidden, o.inter, o.topk
    keys = jax.random.split(jax.random.key(1), 8)
    dp, ip = int4.padded_k(d), int4.padded_k(i)
    # Random INT4 experts directly in the kernel layout (scales ~ absmax/7.5 of N(0, 0.02) weights).
    experts = {}
    for j, (name, kk, n) in enumerate((("gate", dp, i), ("up", dp, i), ("down", ip, d))):
        experts[f"{name}_qweight"] = jax.lax.bitcast_convert_type(
            jax.random.bits(keys[2 * j], (e, kk // 8, n), jnp.uint32), jnp.int32)
        experts[f"{name}_qscale"] = (jax.random.uniform(keys[2 * j + 1], (e, kk // 32, n), minval=0.004,
                                                        maxval=0.01)).astype(jnp.bfloat16).astype(o.scale_dtype)
    expert_bytes = 3 * d * i * (0.5 + 2 / 32)
    # Golden weights for the check tokens' experts (float64 from the HF layout, the math).
    _, _, fixed = _routings(keys[6], 2, e, k, 1)
    check_e = np.unique(np.asarray(fixed))
    sub = {kk: v[check_e] for kk, v in experts.items()}
    hf = moe.experts_to_hf(sub)
    gold_w = {n: dequantize_int4_reference(np.asarray(hf[f"{n}_packed"]), np.asarray(hf[f"{n}_scale"], np.float64))
              for n in ("gate", "up", "down")}
    remap = {int(x): j for j, x in enumerate(check_e)}

    def golden(x, ids, w):
        m = min(x.shape[0], 2)
        local = np.vectorize(remap.get)(np.asarray(ids[:m]))
        return moe_experts_reference(np.asarray(x[:m].astype(jnp.float32)), local, np.asarray(w[:m]),
                                  gold_w["gate"], gold_w["up"], gold_w["down"])

    def bf16_experts():
        out = {}
        for n, kk in (("gate", d), ("up", d), ("down", i)):
            out[f"{n}_kernel"] = jax.jit(lambda q, s: jax.lax.map(
                lambda a: int4.dequantize_kernel_layout(*a, jnp.bfloat16), (q, s)))(
                experts[f"{n}_qweight"], experts[f"{n}_qscale"])[:, :kk]
        return out

    @jax.jit
    def ragged(x, ids, w, experts):
        """Baseline: dequantise every expert to bf16, then jax.lax.ragged_dot over sorted slots."""
        wts = {n: jax.lax.map(lambda a: int4.dequantize_kernel_layout(*a, jnp.bfloat16),
                              (experts[f"{n}_qweight"], experts[f"{n}_qscale"]))
               for n in ("gate", "up", "down")}
        t = x.shape[0]
        flat = ids.reshape(-1)
        order = jnp.argsort(flat, stable=True)
        sizes = jnp.bincount(flat, length=e).astype(jnp.int32)
        xs = x[order // k]
        g = jax.lax.ragged_dot(xs, wts["gate"][:, :d], sizes, preferred_element_type=jnp.float32)
        u = jax.lax.ragged_dot(xs, wts["up"][:, :d], sizes, preferred_element_type=jnp.float32)
        h = (jax.nn.silu(g) * u).astype(x.dtype)
        y = jax.lax.ragged_dot(h, wts["down"][:, :i], sizes, preferred_element_type=jnp.float32)
        y = y * w.reshape(-1)[order][:, None]
        return jnp.zeros((t, d), jnp.float32).at[order // k].add(y).astype(x.dtype)

    c = tuning.MoEConfig
    sweep = {
        "small": [c(16, 32, 64), c(16, 64, 64), c(16, 32, 128), c(16, 64, 64, dequant="bits")],
        "mid": [c(16, 64, 128), c(32, 64, 128), c(32, 128, 128, 8, 3)],
        # bm <= 32: the PTX dequantisation is wrong under the wgmma Triton picks for 64-row blocks
        # (MoEConfig.check); bm 64 / 128 also ran 3-4x slower than bm 16-32 (docs/kernels/moe.md)
        "large": [c(32, 64, 256, 4, 3, scale_weights=True, min_bm=16), c(32, 128, 256, 4, 3, scale_weights=True,
                                                                          min_bm=16),
                  c(16, 64, 256, 4, 3, scale_weights=True)],
    }
    rows, bf16_cache, auto = [], {}, None
    t_start = time.perf_counter()
    for impl in o.impls:
        for t in track(o.tokens, f"moe {impl}", o.progress):
            if (skip := skipped_row(impl, t, time.perf_counter() - t_start, o.budget_s)):
                rows.append(skip)
                print(json.dumps(skip), flush=True)
                continue
            key = jax.random.fold_in(keys[7], t)
            ids_all, w_all, _ = _routings(key, t, e, k, 4)
            # per-input arrays made once: indexing a stacked array inside the timed loop would add
            # eager slicing dispatches to every timed call
            ids_all, w_all = [ids_all[r] for r in range(4)], [w_all[r] for r in range(4)]
            xs = [jax.random.normal(jax.random.fold_in(key, r), (t, d), jnp.bfloat16) for r in range(4)]
            active = float(np.mean([np.unique(np.asarray(a)).size for a in ids_all]))
            if auto is None and jax.default_backend() == "gpu":   # what impl="auto" takes here
                auto = registry.auto_impl("moe_experts", xs[0], ids_all[0], w_all[0], experts)
            nbytes = active * expert_bytes + 2 * t * d * 2
            flops = 2 * t * k * 3 * d * i
            floor = max(nbytes / bw, flops / rate)
            if impl == "pallas_triton":
                group = "small" if t <= 16 else "mid" if t <= 256 else "large"
                cfgs = sweep[group] if o.sweep else [tuning.config(t)]
                cands = [(f"pallas_triton{tuple(c)}", lambda x, a, b, ex, c=c: moe_experts_pallas(x, a, b, ex, cfg=c))
                         for c in cfgs]
            elif impl == "variants":
                cands = [(_cfg_name(c), lambda x, a, b, ex, c=c: moe_experts_pallas(x, a, b, ex, cfg=c))
                         for c in variant_cfgs(t, parse_variants(o.variants))]
            elif impl == "triton_variants":
                cands = [(_cfg_name(c, "triton"), lambda x, a, b, ex, c=c: moe_experts_triton(x, a, b, ex, cfg=c))
                         for c in variant_cfgs(t, parse_variants(o.variants), raw=True)]
            elif impl == "triton":
                cands = [("triton", lambda x, a, b, ex: moe_experts_triton(x, a, b, ex, cfg=tuning.config(t)))]
            elif impl == "xla":
                cands = [("xla", moe_experts_xla)]
            elif impl == "ragged_dot":
                cands = [("dequant+ragged_dot", ragged)]
            else:
                if "ex" not in bf16_cache:
                    bf16_cache["ex"] = bf16_experts()
                cands = [("bf16_weights(pallas)", moe_experts_pallas)]
            ex = bf16_cache["ex"] if impl == "bf16_weights" else experts
            for name, fn in cands:
                row = {"impl": name, "T": t, "active_experts": active, "bytes": nbytes, "flops": flops,
                       "floor_s": floor}
                # each phase's seconds, and a line as the row starts and as each phase ends: a run cut
                # off by a shell timeout still shows where its time went
                phases, mark = row.setdefault("phase_s", {}), [time.perf_counter()]
                print(f"-> {name} T={t}", flush=True)

                def phase(label):
                    now = time.perf_counter()
                    phases[label] = round(now - mark[0], 2)
                    mark[0] = now
                    print(f"   {label} {phases[label]:.1f} s", flush=True)
                try:
                    out = fn(xs[0], ids_all[0], w_all[0], ex)
                    ref = golden(np.asarray(xs[0].astype(jnp.float32)), ids_all[0], w_all[0])
                    got = np.asarray(out[: ref.shape[0]].astype(jnp.float32), np.float64)
                    err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref)) if np.all(np.isfinite(got)) else float("inf")
                    row["rel_err"] = err
                    phase("first_call_and_check")
                    if not err < 2e-2:
                        raise AssertionError(f"rel err {err:.3e} vs golden")
                    if impl in ("variants", "triton_variants"):      # untried forms: every token too
                        row["rel_err_all_tokens"] = all_err = all_tokens_error(out, xs[0], ids_all[0], w_all[0], ex)
                        phase("all_tokens_check")
                        if not all_err < 2e-2:
                            raise AssertionError(f"rel err {all_err:.3e} over all {t} tokens vs the tuned "
                                                 "config with the integer dequantisation")
                    it = iter(range(1 << 30))
                    call = lambda: (lambda r: fn(xs[r], ids_all[r], w_all[r], ex))(next(it) % 4)  # noqa: E731
                    timing.sustain(call, seconds=o.warm_s)
                    phase("warm")
                    t0 = time.time()
                    sec = _time(call, o.min_time_s)
                    row["wall_clocks"] = clocks.window(t0, time.time())
                    phase("wall_clock")
                    row.update(time_us=sec * 1e6, GBps=nbytes / sec / 1e9, pct_copy=100 * nbytes / sec / bw,
                               pct_floor=100 * floor / sec)
                    # traced over the 4 inputs that `active` (the bytes) and the wall clock average
                    sets = [(xs[r], ids_all[r], w_all[r], ex) for r in range(4)]
                    n = trace_calls(sec)
                    traced = (timing.traced_device_time(fn, calls=n, warm=n // 2, arg_sets=sets)
                              if o.trace else None)
                    row["trace_clocks"] = clocks.window(*traced["host_window"]) if traced else {}
                    phase("trace")
                    if o.load_s > 0 and impl == "xla":
                        row["load_skipped"] = XLA_NO_LOAD
                    elif o.load_s > 0 and (lp := timing.load_profile(
                            fn, sets, load_s=o.load_s, idle_s=o.idle_s, clocks=clocks)):
                        row["load"] = lp
                    phase("load")
                    if traced:
                        w_bytes = d * i * (2 if impl == "bf16_weights" else 0.5 + 2 / 32) * active
                        row.update(device_us=traced["busy_us"], span_us=traced["span_us"], kernels=traced["kernels"],
                                   top_kernels=traced["top"],
                                   **kernel_split(traced["top"], traced["busy_us"],
                                                  {"gate_up": 2 * w_bytes, "down": w_bytes}, bw))
                except Exception as exc:  # record and go on: OOM, compile failure, wrong result
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                rows.append(row)
                print(json.dumps(row), flush=True)
            if impl == "variants":
                rows.extend(_time_parts(o, t, e, k, xs, ids_all, w_all, ex))
    if "ex" in bf16_cache:
        for row in rows:
            if row["impl"].startswith("bf16") and "time_us" in row:
                row["bytes"] = row["active_experts"] * 3 * d * i * 2 + 4 * row["T"] * d
                row["GBps"] = row["bytes"] / row["time_us"] / 1e3
                row["pct_copy"] = 100 * row["bytes"] / (row["time_us"] * 1e-6) / bw
    for row in rows:
        if "device_us" in row and "bytes" in row:
            row["pct_copy_device"] = 100 * row["bytes"] / (row["device_us"] * 1e-6) / bw
        for regime in ("burst", "first", "sustained"):
            if row.get("load", {}).get(f"{regime}_us"):
                row[f"{regime}_pct_copy"] = 100 * row["bytes"] / (row["load"][f"{regime}_us"] * 1e-6) / bw
                # against the copy timed the same way, in the same regime (sustained_copy)
                if (load_bw := ceil.get("copy_load", {}).get(f"{regime}_tbps")):
                    row[f"{regime}_pct_copy_load"] = 100 * row["bytes"] / (row["load"][f"{regime}_us"] * 1e-6) / (
                        load_bw * 1e12)
    return {"ceilings": ceil, "rows": rows, "jax": jax.__version__, "device": str(jax.devices()[0]),
            "scale_dtype": o.scale_dtype, "auto_impl": auto}


def trace_calls(call_s: float) -> int:
    """Calls --trace profiles (after half as many) for calls of call_s seconds each: 16, or as many
    as take 0.2 s, at least 2. The xla path's call at T = 256 (80 ms) launches thousands of
    kernels; 24 of them in one trace took over 300 s to export on the H200."""
    return int(min(16, max(2, round(0.2 / call_s))))


def skipped_row(impl: str, t: int, elapsed_s: float, budget_s: float) -> dict | None:
    """The row of an implementation and T not started because the run is past --budget_s (None
    while within it, or with no budget)."""
    if budget_s > 0 and elapsed_s > budget_s:
        return {"impl": impl, "T": t, "error": f"skipped: past --budget_s={budget_s:.0f} ({elapsed_s:.0f} s in)"}
    return None


def _time_parts(o: Options, t, e, k, xs, ids_all, w_all, ex) -> list:
    """Rows "parts:<stage>" for the tuned config at T; gate_up and down each include the routing
    alignment (subtract the routing row); down's and combine's inputs are the outputs of the
    stages before them (no golden check: the whole op was checked as pallas_triton)."""
    from pallas_kernels.moe import tuning
    cfg = tuning.config(t)
    parts = _parts(t, cfg, e, k)
    rows = []
    try:
        h = [parts["gate_up"](xs[r], ids_all[r], w_all[r], ex) for r in range(4)]
        y = [parts["down"](h[r], ids_all[r], w_all[r], ex) for r in range(4)]
        inputs = {"routing": xs, "gate_up": xs, "down": h, "combine": y}
        for name, fn in parts.items():
            def call(fn=fn, src=inputs[name], it=iter(range(1 << 30))):
                r = next(it) % 4
                return jax_leaf(fn(src[r], ids_all[r], w_all[r], ex))

            sec = _time(call, o.min_time_s)
            rows.append({"impl": f"parts:{name}{tuple(cfg)[:6]}", "T": t, "time_us": sec * 1e6})
            traced = (timing.traced_device_time(fn, inputs[name][0], ids_all[0], w_all[0], ex)
                      if o.trace else None)
            if traced:
                rows[-1].update(device_us=traced["busy_us"], kernels=traced["kernels"],
                                top_kernels=traced["top"])
    except Exception as exc:
        rows.append({"impl": "parts", "T": t, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
    for row in rows:
        print(json.dumps(row), flush=True)
    return rows


def jax_leaf(out):
    """First array leaf of a stage's output (to block on)."""
    import jax
    return jax.tree_util.tree_leaves(out)[0]


def regimes_table(res: dict) -> str:
    """Markdown: per row with a load profile (--load_s), device us per call (% of copy, SM MHz) in a
    burst, in the burst's first 25 ms (a heavy call is throttled inside the burst window:
    timing.regimes) and under sustained load, and each regime's % of the copy under the same
    load; a row without a profile says why (load_skipped)."""
    def cell(r, regime, clock=True):
        us = r["load"].get(f"{regime}_us")
        if us is None:
            return "-"
        if not clock:
            return f"{us:.1f} ({r[f'{regime}_pct_copy']:.1f})"
        mhz = r["load"].get(f"{regime}_clocks", {}).get("sm_mhz")
        return f"{us:.1f} ({r[f'{regime}_pct_copy']:.1f}, {'-' if mhz is None else f'{mhz:.0f}'})"

    def same_load(r):
        got = [r.get(f"{regime}_pct_copy_load") for regime in ("burst", "sustained")]
        return " / ".join("-" if v is None else f"{v:.1f}" for v in got)
    lines = []
    if cl := res.get("ceilings", {}).get("copy_load"):
        def mhz(regime):
            v = cl.get(f"{regime}_clocks", {}).get("sm_mhz")
            return "-" if v is None else f"{v:.0f}"

        def tbps(regime):
            v = cl.get(f"{regime}_tbps")
            return "-" if v is None else f"{v:.3f}"
        lines += [f"copy under the same load: burst {tbps('burst')} TB/s (SM {mhz('burst')} MHz), "
                  f"sustained {tbps('sustained')} TB/s (SM {mhz('sustained')} MHz); "
                  f"% copy below is of {res['ceilings']['copy_tbps']:.3f} TB/s (measure_ceilings)", ""]
    lines += ["| T | impl | active E | MB moved | floor us | burst us (% copy, SM MHz) | first 25 ms us (% copy) "
              "| sustained us (% copy, SM MHz) | % of the copy under the same load, burst / sustained |",
              "|---:|---|---:|---:|---:|---|---|---|---|"]
    for r in res["rows"]:
        if "load_skipped" in r:
            lines.append(f"| {r['T']} | {r['impl']} | {r['active_experts']:.1f} | {r['bytes'] / 1e6:.0f} | "
                         f"{r['floor_s'] * 1e6:.0f} | - | - | - | {r['load_skipped']} |")
        if "load" in r:
            lines.append(f"| {r['T']} | {r['impl']} | {r['active_experts']:.1f} | {r['bytes'] / 1e6:.0f} | "
                         f"{r['floor_s'] * 1e6:.0f} | {cell(r, 'burst')} | {cell(r, 'first', clock=False)} | "
                         f"{cell(r, 'sustained')} | {same_load(r)} |")
    return "\n".join(lines)


def table(res: dict) -> str:
    """Markdown: per row the wall-clock figures, then (with --trace) device time, its % of copy, the
    GEMM kernels' us (% of copy by their own bytes) and the glue (`kernel_split`)."""
    nan = float("nan")
    lines = ["| T | impl | active E | MB moved | time us | GB/s | % copy | % floor | rel err "
             "| device us (trace) | span us | % copy (device) | gate_up us (% copy) | down us (% copy) | glue us "
             "| kernels | SM MHz wall / trace |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        if r["impl"].startswith("parts"):
            lines.append(f"| {r['T']} | {r['impl']} | | | {r.get('time_us', 0):.1f} | | | | "
                         f"{r.get('error', '')[:80]} | {r.get('device_us', nan):.1f} | | | | | | "
                         f"{r.get('kernels', nan):.0f} | |")
        elif "time_us" in r:
            gemms = " | ".join(f"{r[f'{p}_us']:.1f} ({r[f'{p}_pct_copy']:.1f})" if f"{p}_us" in r else ""
                               for p in ("gate_up", "down"))
            glue = f"{r['glue_us']:.1f}" if "glue_us" in r else ""       # only beside the two GEMM kernels
            lines.append(f"| {r['T']} | {r['impl']} | {r['active_experts']:.1f} | {r['bytes'] / 1e6:.0f} | "
                         f"{r['time_us']:.1f} | {r['GBps']:.0f} | {r['pct_copy']:.1f} | {r['pct_floor']:.1f} | "
                         f"{r['rel_err']:.1e} | {r.get('device_us', nan):.1f} | {r.get('span_us', nan):.1f} | "
                         f"{r.get('pct_copy_device', nan):.1f} | "
                         f"{gemms} | {glue} | {r.get('kernels', nan):.0f} | {timing.row_mhz(r)} |")
        else:
            active = f"{r['active_experts']:.1f}" if "active_experts" in r else ""
            lines.append(f"| {r['T']} | {r['impl']} | {active} | | | | | | "
                         f"{r.get('error', '')[:80]} | | | | | | | | |")
    return "\n".join(lines)
