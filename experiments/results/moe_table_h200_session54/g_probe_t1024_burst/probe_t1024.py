"""Session 54 probe: is the T = 1024 burst bimodality per routing or per time? Per-call device time of
the tuned raw kernels over 3 loads (2 s idle, 3 s of calls cycling 4 routings), by routing index."""
import os, time, json
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import numpy as np, jax, jax.numpy as jnp
from ddtree_jax import bench_util
from experiments.kernel_bench import _routings
from pallas_kernels.moe import int4, tuning
from pallas_kernels.moe.triton_impl import moe_experts_triton
e, d, i, k, t = 384, 7168, 2048, 8, 1024
keys = jax.random.split(jax.random.key(1), 8)
dp, ip = int4.padded_k(d), int4.padded_k(i)
ex = {}
for j, (name, kk, n) in enumerate((("gate", dp, i), ("up", dp, i), ("down", ip, d))):
    ex[f"{name}_qweight"] = jax.lax.bitcast_convert_type(jax.random.bits(keys[2 * j], (e, kk // 8, n), jnp.uint32), jnp.int32)
    ex[f"{name}_qscale"] = jax.random.uniform(keys[2 * j + 1], (e, kk // 32, n), minval=0.004, maxval=0.01).astype(jnp.bfloat16)
key = jax.random.fold_in(keys[7], t)
ids, w, _ = _routings(key, t, e, k, 4)
sets = [(jax.random.normal(jax.random.fold_in(key, r), (t, d), jnp.bfloat16), ids[r], w[r], ex) for r in range(4)]
fn = lambda x, a, b, ex: moe_experts_triton(x, a, b, ex, cfg=tuning.config(t))
print("cfg", tuning.config(t))
out = {"reps": []}
with bench_util.GpuClocks() as clocks:
    for a in sets:
        jax.block_until_ready(fn(*a))
    for rep in range(3):
        time.sleep(2.0)
        h0, n, waits, kernels = bench_util.loaded_trace(fn, sets, 3.0)
        calls = bench_util.calls_busy(kernels, n)
        rows = [dict(c=c, r=c % 4, start_ms=s / 1e3, us=u) for c, (s, u) in enumerate(calls)]
        out["reps"].append(dict(rows=rows, clocks_burst=clocks.window(h0, h0 + 0.1), clocks_late=clocks.window(h0 + 1, waits[-1][0])))
        for lo, hi in ((0, 100), (100, 300), (1000, 1e9)):
            sel = [x for x in rows if lo <= x["start_ms"] < hi]
            by = {r: np.median([x["us"] for x in sel if x["r"] == r]) for r in range(4)}
            print(f"rep {rep} {lo}-{hi} ms: n={len(sel)} median {np.median([x['us'] for x in sel]):.0f} by routing "
                  + " ".join(f"{r}:{v:.0f}" for r, v in by.items()))
        print("  first 12 calls:", " ".join(f"{x['r']}:{x['us']:.0f}" for x in rows[:12]))
        print("  clocks burst", out["reps"][-1]["clocks_burst"].get("sm_mhz"), "late", out["reps"][-1]["clocks_late"].get("sm_mhz"))
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "probe_t1024.json"), "w"))
