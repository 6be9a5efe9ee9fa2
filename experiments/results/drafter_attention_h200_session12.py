"""Session-12 probe, kept as run on the H200 at 386af4b (BENCHMARKS.md "Session 12"): `OUT=.
PYTHONPATH=. python3 experiments/results/drafter_attention_h200_session12.py` -> drafter_micro2.json,
saved as drafter_attention_h200_session12.json.
Drafter block attention on the H200: device time per call (profiler), xla vs the default
pallas_triton config, at the shipped drafter's shape (b 16, 4 heads over 1 KV head, hd 64)."""
import json, os
import jax, jax.numpy as jnp, numpy as np
from ddtree_jax import bench_util
from pallas_kernels import registry
from pallas_kernels.drafter_attention import pallas_triton as dp
from pallas_kernels.drafter_attention.reference import drafter_attention_reference

rows = []
fns = dict(xla=jax.jit(lambda *a: registry.get("drafter_attention", "xla")(*a, scale=0.125)),
           pallas_triton=jax.jit(lambda *a: registry.get("drafter_attention", "pallas_triton")(*a, scale=0.125)),
           pallas_poison=jax.jit(lambda *a: dp.drafter_attention_pallas(*a, scale=0.125, poison=True)))
for B in (1, 4, 16):
  for N, lo, hi in ((289, 96, 225), (1024, 600, 1000)):
    rng = np.random.default_rng(B * 7 + N + 1)
    draw = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.bfloat16)
    args = (draw(B, 16, 4, 64), draw(B, 1, N, 64), draw(B, 1, N, 64),
            jnp.asarray(rng.integers(lo, hi, B), jnp.int32), draw(B, 16, 1, 64), draw(B, 16, 1, 64))
    gold = drafter_attention_reference(*(np.asarray(a, np.float64 if a.dtype == jnp.bfloat16 else np.int64) for a in args), scale=0.125)
    r = dict(B=B, N=N, splits=dp.default_splits(B, N, 64))
    for name, f in fns.items():
        r[name + "_rel_err"] = float(np.abs(np.asarray(f(*args), np.float64) - gold).max() / np.abs(gold).max())
        if name != "pallas_poison":
            t = bench_util.traced_device_time(f, *args, calls=30)
            r[name + "_us"], r[name + "_kernels"] = t["busy_us"], t["kernels"]
    r["speedup"] = r["xla_us"] / r["pallas_triton_us"]
    rows.append(r)
json.dump(rows, open(os.environ["OUT"] + "/drafter_micro2.json", "w"), indent=1)
print(bench_util.markdown_table(rows, list(rows[0])))
