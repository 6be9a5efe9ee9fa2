"""Session-13 probe 2, kept as run on the H200 (-> qkv13b.json, saved as drafter_qkv_rows_h200_session13.json): drafter_qkv pallas_triton rows per program (16 / 32 / 64) at the shipped
drafter's shapes, device time per call (profiler); xla alongside."""
import json, os
import jax, jax.numpy as jnp, numpy as np
from ddtree_jax import bench_util, rope
from pallas_kernels.drafter_qkv import drafter_qkv
from pallas_kernels.drafter_qkv.pallas_triton import drafter_qkv_pallas

rows = []
inv = jnp.asarray(rope.inv_freq(64, 1e6).astype(np.float32))
for S in (1, 4, 16, 64):
    for kind in ("block", "context"):
        rng = np.random.default_rng(S)
        bf = lambda *s, sc=1.0: jnp.asarray(rng.standard_normal(s) * sc, jnp.bfloat16)
        near1 = lambda n: jnp.asarray(1 + 0.2 * rng.standard_normal(n), jnp.bfloat16)
        q = kind == "block"
        args = (bf(S, 16, 256), jnp.asarray(rng.integers(0, 400, (S, 16)), jnp.int32),
                bf(256, 256, sc=1 / 16) if q else None, bf(256, 64, sc=1 / 16), bf(256, 64, sc=1 / 16),
                near1(64) if q else None, near1(64))
        norm = near1(256)
        r = dict(S=S, kind=kind)
        f = jax.jit(lambda *a: drafter_qkv(*a, inv, norm=norm, eps=1e-6, impl="xla"))
        r["xla_us"] = round(bench_util.traced_device_time(f, *args, calls=30)["busy_us"], 2)
        want = f(*args)
        for bm in (16, 32, 64):
            f = jax.jit(lambda *a, bm=bm: drafter_qkv_pallas(*a, inv, norm=norm, eps=1e-6, block_rows=bm))
            got = f(*args)
            r[f"bm{bm}_maxdiff"] = max(float(jnp.abs(g.astype(jnp.float32) - w.astype(jnp.float32)).max())
                                       for g, w in zip(got, want) if w is not None)
            r[f"bm{bm}_us"] = round(bench_util.traced_device_time(f, *args, calls=30)["busy_us"], 2)
        rows.append(r)
        print(r, flush=True)
json.dump(rows, open(os.environ["OUT"] + "/qkv13b.json", "w"), indent=1)
print(bench_util.markdown_table(rows, [c for c in rows[0] if "maxdiff" not in c]))
