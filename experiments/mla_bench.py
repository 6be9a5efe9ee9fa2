"""Benchmark MLA tree-verify attention against its roofline (Kimi-K2 dims by default).

For each (ctx, Q, S): time of every implementation, FLOPs = 2*S*Q*H*(ctx+Q)*(Dk+v_dim), bytes =
latent cache read once + queries + outputs, the floor max(bytes / copy_bw, FLOPs / matmul_rate)
from ceilings measured in the same run, and % of floor. Pallas outputs are checked against the
xla implementation on every shape, and both against the float64 numpy golden on a small case.

  export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
  python3 experiments/mla_bench.py --out=/tmp/mla_bench.json
  python3 experiments/mla_bench.py --ctx=8192 --q=16,64 --streams=8 --configs=64x64x8x2,32x64x4x2
"""

from __future__ import annotations

import json
import statistics
import time

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.mla_attention import pallas_triton, visibility_to_mask, xla
from pallas_kernels.mla_attention.reference import mla_attention_reference

FLAGS = flags.FLAGS
flags.DEFINE_list("ctx", ["1024", "8192", "32768"], "context lengths")
flags.DEFINE_list("q", ["1", "16", "64", "256"], "new tokens (tree nodes) per stream")
flags.DEFINE_list("streams", ["1", "8", "16"], "streams S")
flags.DEFINE_integer("heads", 64, "query heads H")
flags.DEFINE_integer("dk", 576, "latent width (kv_lora + rope)")
flags.DEFINE_integer("v_dim", 512, "value width (kv_lora)")
flags.DEFINE_list("configs", ["32x64x4x2"], "pallas BlockConfigs block_m x block_n x warps x stages")
flags.DEFINE_list("impls", ["pallas_triton", "xla"], "implementations to time")
flags.DEFINE_string("out", "", "write rows and ceilings as JSON here")


def parse_config(text: str) -> pallas_triton.BlockConfig:
    bm, bn, warps, stages = (int(x) for x in text.split("x"))
    return pallas_triton.BlockConfig(block_m=bm, block_n=bn, num_warps=warps, num_stages=stages)


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


def measure_ceilings() -> dict:
    """Copy bandwidth (torch copy_, 2 GiB) and bf16 matmul rate (8192^3, XLA and torch)."""
    import torch
    import triton

    n = 8192
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
    xla_s = time_jax(jax.jit(lambda x: x @ x), [(a,)])
    ta = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    torch_s = triton.testing.do_bench(lambda: ta @ ta, warmup=50, rep=300, return_mode="median") / 1e3
    src = torch.randn(2**30, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    copy_s = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median") / 1e3
    del src, dst, ta
    torch.cuda.empty_cache()
    return {"copy_tbps": 2 * 2**31 / copy_s / 1e12,
            "matmul_tflops_xla": 2 * n**3 / xla_s / 1e12,
            "matmul_tflops_torch": 2 * n**3 / torch_s / 1e12}


def bushy_masks(rng, num_s: int, num_q: int) -> np.ndarray:
    """Random trees (parent of node i uniform over earlier nodes): ancestor-or-self [S, Q, Q]."""
    vis = np.zeros((num_s, num_q, num_q), bool)
    for s in range(num_s):
        for i in range(num_q):
            vis[s, i] = vis[s, rng.integers(0, i)] if i else False
            vis[s, i, i] = True
    return vis


def make_inputs(key, num_s, num_q, heads, dk, ctx, num_slots, sets):
    rng = np.random.default_rng(int(jax.random.randint(key, (), 0, 2**31 - 1)))
    mask = visibility_to_mask(bushy_masks(rng, num_s, num_q))
    ctx_lens = jnp.full((num_s,), ctx, jnp.int32)
    out = []
    for k in jax.random.split(key, sets):
        kq, kk = jax.random.split(k)
        q = jax.random.normal(kq, (num_s, num_q, heads, dk), jnp.bfloat16)
        kv = jax.random.normal(kk, (num_s, num_slots, dk), jnp.bfloat16)
        out.append((q, kv, ctx_lens, mask))
    return out


def golden_check(heads, dk, v_dim, configs) -> dict:
    """Ragged small case at full head layout: each pallas config and xla vs the float64 golden."""
    num_s, num_q, ctx = 3, 37, [0, 1000, 2085]
    rng = np.random.default_rng(1)
    q = jnp.asarray(rng.standard_normal((num_s, num_q, heads, dk)), jnp.bfloat16)
    kv = jnp.asarray(rng.standard_normal((num_s, max(ctx) + num_q + 11, dk)), jnp.bfloat16)
    ctx_lens, mask = jnp.asarray(ctx, jnp.int32), visibility_to_mask(bushy_masks(rng, num_s, num_q))
    scale = dk ** -0.5
    ref = mla_attention_reference(q, kv, ctx_lens, mask, scale=scale, v_dim=v_dim)
    errs = {"xla": _rel(xla.mla_attention_xla(q, kv, ctx_lens, mask, scale=scale, v_dim=v_dim), ref)}
    for name, cfg in configs.items():
        for splits in (1, 5):
            cfg_s = pallas_triton.BlockConfig(cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages, splits)
            try:
                out = pallas_triton.mla_attention_pallas(q, kv, ctx_lens, mask, scale=scale, v_dim=v_dim,
                                                         config=cfg_s, poison=True)
                errs[f"pallas {name} splits={splits}"] = _rel(out, ref)
            except Exception as e:  # report and go on: one config failing must not end the run
                errs[f"pallas {name} splits={splits}"] = f"{type(e).__name__}: {_short(e)}"
    return errs


def _short(e: Exception) -> str:
    """The first line that names an error (compiler dumps are long)."""
    lines = str(e).splitlines()
    return next((ln for ln in lines if "error" in ln.lower()), lines[0] if lines else "")[:300]


def _rel(out, ref) -> float:
    out = np.asarray(out, np.float64)
    if not np.all(np.isfinite(out)):
        return float("inf")
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


def run_mla_bench(ctxs, qs, streams, *, heads=64, dk=576, v_dim=512, configs=None,
                  impls=("pallas_triton", "xla"), ceilings=None, log=print) -> list[dict]:
    """Time every (ctx, Q, S) shape; returns one dict per (shape, implementation or config)."""
    configs = configs or {"32x64x4x2": pallas_triton.BlockConfig()}
    ceilings = ceilings or measure_ceilings()
    copy_bw = ceilings["copy_tbps"] * 1e12
    rate = max(ceilings["matmul_tflops_xla"], ceilings["matmul_tflops_torch"]) * 1e12
    scale = dk ** -0.5
    rows = []
    for ctx in ctxs:
        for num_q in qs:
            for num_s in streams:
                num_slots = ctx + num_q
                flops = 2 * num_s * num_q * heads * (ctx + num_q) * (dk + v_dim)
                nbytes = 2 * num_s * (num_slots * dk + num_q * heads * (dk + v_dim))
                floor = max(nbytes / copy_bw, flops / rate)
                sets = int(min(8, max(1, -(-(256 << 20) // (2 * num_s * num_slots * dk)))))
                args = make_inputs(jax.random.key(ctx * 7 + num_q * 3 + num_s), num_s, num_q, heads, dk,
                                   ctx, num_slots, sets)
                fns = {}
                if "xla" in impls:
                    fns["xla"] = jax.jit(lambda *a: xla.mla_attention_xla(*a, scale=scale, v_dim=v_dim))
                if "pallas_triton" in impls:
                    for name, cfg in configs.items():
                        fns[f"pallas {name}"] = jax.jit(
                            lambda *a, cfg=cfg: pallas_triton.mla_attention_pallas(
                                *a, scale=scale, v_dim=v_dim, config=cfg))
                ref = fns["xla"](*args[0]) if "xla" in fns else None
                for name, fn in fns.items():
                    row = dict(ctx=ctx, q=num_q, s=num_s, impl=name, flops=flops, bytes=nbytes,
                               floor_ms=floor * 1e3)
                    try:
                        if ref is not None and name != "xla":
                            row["rel_err_vs_xla"] = _rel(fn(*args[0]), np.asarray(ref, np.float64))
                        sec = time_jax(fn, args)
                        row.update(ms=sec * 1e3, pct_floor=100 * floor / sec, tflops=flops / sec / 1e12)
                    except Exception as e:  # one failing config must not end the sweep
                        row["error"] = f"{type(e).__name__}: {_short(e)}"
                    rows.append(row)
                    log(_fmt(row))
                del args, ref
    return rows


def _fmt(r: dict) -> str:
    head = f"ctx={r['ctx']:6d} Q={r['q']:4d} S={r['s']:3d} {r['impl']:22s}"
    if "error" in r:
        return f"{head} ERROR {r['error']}"
    err = f" err={r['rel_err_vs_xla']:.1e}" if "rel_err_vs_xla" in r else ""
    return (f"{head} {r['ms']:9.3f} ms  floor {r['floor_ms']:8.3f} ms  {r['pct_floor']:5.1f}% "
            f"{r['tflops']:6.1f} TF/s{err}")


def table(rows: list[dict]) -> str:
    """Markdown: one line per shape, best pallas config vs xla."""
    out = ["| ctx | Q | S | GFLOP | MB | floor ms | pallas ms | % floor | xla ms | speedup | config |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    shapes = sorted({(r["ctx"], r["q"], r["s"]) for r in rows})
    for shape in shapes:
        rs = [r for r in rows if (r["ctx"], r["q"], r["s"]) == shape and "ms" in r]
        pal = [r for r in rs if r["impl"].startswith("pallas")]
        xla = [r for r in rs if r["impl"] == "xla"]
        if not pal:
            continue
        best = min(pal, key=lambda r: r["ms"])
        x = f"{xla[0]['ms']:.3f} | {xla[0]['ms'] / best['ms']:.2f}x" if xla else "- | -"
        out.append(f"| {shape[0]} | {shape[1]} | {shape[2]} | {best['flops'] / 1e9:.1f} | "
                   f"{best['bytes'] / 1e6:.1f} | {best['floor_ms']:.3f} | {best['ms']:.3f} | "
                   f"{best['pct_floor']:.1f} | {x} | {best['impl'][7:]} |")
    return "\n".join(out)


def main(_):
    configs = {c: parse_config(c) for c in FLAGS.configs}
    ceilings = measure_ceilings()
    print(f"ceilings {json.dumps(ceilings)}  device {jax.devices()[0].device_kind}  jax {jax.__version__}")
    golden = golden_check(FLAGS.heads, FLAGS.dk, FLAGS.v_dim, configs)
    print("golden rel err", json.dumps(golden))
    rows = run_mla_bench([int(x) for x in FLAGS.ctx], [int(x) for x in FLAGS.q],
                         [int(x) for x in FLAGS.streams], heads=FLAGS.heads, dk=FLAGS.dk,
                         v_dim=FLAGS.v_dim, configs=configs, impls=tuple(FLAGS.impls), ceilings=ceilings)
    if FLAGS.out:
        with open(FLAGS.out, "w") as f:
            json.dump({"ceilings": ceilings, "golden": golden, "rows": rows,
                       "device": jax.devices()[0].device_kind, "jax": jax.__version__}, f, indent=1)
    print(table(rows))


if __name__ == "__main__":
    app.run(main)
