"""Session-13 probe, kept as run on the H200 with 64 rows per program (`OUT=. PYTHONPATH=. python3 experiments/results/drafter_qkv_h200_session13.py` -> qkv13.json, saved as drafter_qkv_h200_session13.json): the drafter's fused projection ("drafter_qkv") on the H200, xla vs
pallas_triton, device time per call (profiler) at the shipped drafter's shapes (d 256, 4 heads over
1 KV head of 64): the block (S x 16 rows, q/k/v, input_layernorm) and the context append (S x 16
rows, k/v, hidden_norm), with the error of each against the float64 golden (bf16 operands)."""
import json, os
import jax, jax.numpy as jnp, numpy as np
from ddtree_jax import bench_util, rope
from pallas_kernels.drafter_qkv import drafter_qkv
from pallas_kernels.drafter_qkv.reference import drafter_qkv_reference

rows = []
inv = rope.inv_freq(64, 1e6).astype(np.float32)
for S in (1, 4, 16):
    for kind in ("block", "context"):
        rng = np.random.default_rng(S)
        bf = lambda *s, sc=1.0: jnp.asarray(rng.standard_normal(s) * sc, jnp.bfloat16)
        near1 = lambda n: jnp.asarray(1 + 0.2 * rng.standard_normal(n), jnp.bfloat16)
        q = kind == "block"
        args = (bf(S, 16, 256), jnp.asarray(rng.integers(0, 400, (S, 16)), jnp.int32),
                bf(256, 256, sc=1 / 16) if q else None, bf(256, 64, sc=1 / 16), bf(256, 64, sc=1 / 16),
                near1(64) if q else None, near1(64))
        norm = near1(256)
        f64 = lambda a: None if a is None else np.asarray(a, np.float64 if a.dtype == jnp.bfloat16 else a.dtype)
        gold = drafter_qkv_reference(*map(f64, args), inv, norm=f64(norm), eps=1e-6)
        r = dict(S=S, kind=kind)
        for impl in ("xla", "pallas_triton"):
            f = jax.jit(lambda *a, impl=impl: drafter_qkv(*a, inv, norm=norm, eps=1e-6, impl=impl))
            out = f(*args)
            r[impl + "_err"] = max(float(np.abs(np.asarray(o, np.float64) - g).max() / np.abs(g).max())
                                   for o, g in zip(out, gold) if g is not None)
            t = bench_util.traced_device_time(f, *args, calls=30)
            r[impl + "_us"], r[impl + "_kernels"] = round(t["busy_us"], 2), t["kernels"]
        r["speedup"] = round(r["xla_us"] / r["pallas_triton_us"], 2)
        rows.append(r)
        print(r, flush=True)
json.dump(rows, open(os.environ["OUT"] + "/qkv13.json", "w"), indent=1)
print(bench_util.markdown_table(rows, list(rows[0])))
