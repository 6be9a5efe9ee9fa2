"""Session-12 probe, kept as run on the H200 with 386af4b's split kernel before its defaults were
set from this run ("sauto" rows: TARGET_PROGRAMS was 64; BENCHMARKS.md "Session 12"): `OUT=. PYTHONPATH=. python3
experiments/results/drafter_attention_h200_session12_configs.py` -> drafter_micro.json, saved as
drafter_attention_h200_session12_configs.json. Config names: p{block_n}s{splits}x{warps}x{stages}.
Drafter block attention on the H200: device time per call (profiler) of xla and pallas_triton
configs at the shipped drafter's shape (b 16, 4 heads over 1 KV head, hd 64)."""
import json, os
import jax, jax.numpy as jnp, numpy as np
from ddtree_jax import bench_util
from pallas_kernels import registry
from pallas_kernels.drafter_attention import pallas_triton as dp
from pallas_kernels.drafter_attention.reference import drafter_attention_reference

rows = []
xla_fn = jax.jit(lambda *a: registry.get("drafter_attention", "xla")(*a, scale=0.125))
for B in (1, 16):
  for N, lo, hi in ((289, 96, 225), (1024, 600, 1000)):
    rng = np.random.default_rng(B * 7 + N)
    draw = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.bfloat16)
    args = (draw(B, 16, 4, 64), draw(B, 1, N, 64), draw(B, 1, N, 64),
            jnp.asarray(rng.integers(lo, hi, B), jnp.int32), draw(B, 16, 1, 64), draw(B, 16, 1, 64))
    gold = drafter_attention_reference(*(np.asarray(a, np.float64 if a.dtype == jnp.bfloat16 else np.int64) for a in args), scale=0.125)
    cands = {"xla": xla_fn}
    for bn in (32, 64):
      for sp in (1, 2, 4, 8, None):
        for st in (1, 2):
          cands[f"p{bn}s{sp or 'auto'}x4x{st}"] = jax.jit(lambda *a, bn=bn, sp=sp, st=st: dp.drafter_attention_pallas(
              *a, scale=0.125, block_n=bn, num_splits=sp, num_warps=4, num_stages=st))
    for name, f in cands.items():
      try:
        err = float(np.abs(np.asarray(f(*args), np.float64) - gold).max() / np.abs(gold).max())
        t = bench_util.traced_device_time(f, *args, calls=20)
        rows.append(dict(B=B, N=N, impl=name, us=t["busy_us"], kernels=t["kernels"], rel_err=err))
      except Exception as e:
        rows.append(dict(B=B, N=N, impl=name, error=str(e)[:300]))
json.dump(rows, open(os.environ["OUT"] + "/drafter_micro.json", "w"), indent=1)
bad = [r for r in rows if "error" in r or r["rel_err"] > 1e-2]
print("errors/bad:", bad[:3])
for B in (1, 16):
  for N in (289, 1024):
    rs = [r for r in rows if r["B"] == B and r["N"] == N and "us" in r]
    x = [r for r in rs if r["impl"] == "xla"][0]
    d = [r for r in rs if r["impl"] == "p64sautox4x2"][0]
    best = sorted(rs, key=lambda r: r["us"])[:4]
    print(f"B={B} N={N} xla {x['us']:.1f}us/{x['kernels']:.0f}k default {d['us']:.1f}/{d['kernels']:.0f}k best: " + ", ".join(f"{r['impl']} {r['us']:.1f}" for r in best))
