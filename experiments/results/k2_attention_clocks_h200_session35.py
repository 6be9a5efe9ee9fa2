"""Session 35 (BENCHMARKS.md issue 5; log beside it): the model-width attention call of
k2_projection --measure (mla_attention "auto" at 16k, Q = budget + 1, S 8 / 16, a chain tree) timed
three ways, with attn_balance on and off: the wall clock of one call per round as k2_projection
times it (median of 5), the wall clock of 20 calls back to back per round (median of 5), and the
device time from a profiler trace (10 calls). Each output is checked against the xla path first.
Run (device): python3 <this file>."""
import time
import jax, jax.numpy as jnp, numpy as np
from ddtree_jax import bench_util
from ddtree_jax.model import aligned_slots
from pallas_kernels import registry
from pallas_kernels.mla_attention import mosaic_gpu, visibility_to_mask

attend, ref_fn = registry.get("mla_attention"), registry.get("mla_attention", "xla")
kw = dict(scale=576 ** -0.5, v_dim=512)
rng, rows, t0 = np.random.default_rng(0), [], time.time()
for s in (8, 16):
    for b in (4, 8, 16, 32, 64):
        q = b + 1
        lens = jnp.full((s,), 16384, jnp.int32)
        kv = jnp.asarray(rng.normal(0, 1, (s, aligned_slots(16384 + q), 576)), jnp.bfloat16)
        qa = jnp.asarray(rng.normal(0, 1, (s, q, 64, 576)), jnp.bfloat16)
        mask = visibility_to_mask(jnp.broadcast_to(jnp.tril(jnp.ones((q, q), bool)), (s, q, q)))
        ref = np.asarray(jax.jit(lambda a, c: ref_fn(a, c, lens, mask, **kw))(qa, kv), np.float64)
        for bal in (True, False):
            fn = jax.jit(lambda a, c, bal=bal: attend(a, c, lens, mask, balance=bal, **kw))
            out = np.asarray(fn(qa, kv), np.float64)
            err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
            assert err < 1e-2, (s, b, bal, err)
            runs = mosaic_gpu.launch(*mosaic_gpu.prepare(qa, kv, lens, mask)[:2], balance=bal)[1]
            wall1 = bench_util.median_seconds(fn, qa, kv, reps=5) * 1e6
            wall20 = bench_util.median_seconds(fn, qa, kv, reps=5, inner=20) * 1e6
            tr = bench_util.traced_device_time(fn, qa, kv, calls=10)
            rows.append(dict(S=s, budget=b, balance=bal, runs=runs, wall1_us=round(wall1, 1),
                             wall20_us=round(wall20, 1), device_us=round(tr["busy_us"], 1),
                             kernels=tr["kernels"], rel_err=f"{err:.1e}"))
            print(rows[-1], f"{time.time() - t0:.0f}s", flush=True)
print(bench_util.markdown_table(rows, list(rows[0])))
