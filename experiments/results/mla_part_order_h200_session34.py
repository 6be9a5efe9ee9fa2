"""Session 34 (BENCHMARKS.md issue 5; log beside it): runs.part_order's argsort form (session 33)
against its rank form (now in runs.py), device us per call from a profiler trace (20 calls), each
form twice, alternating; both orders checked equal first. Run (device): python3 <this file>."""
import jax, jax.numpy as jnp, numpy as np
from ddtree_jax import bench_util
from pallas_kernels.mla_attention import runs

def old_order(ctx_lens, num_q, width):
    return jnp.argsort(-runs.part_runs(ctx_lens, num_q, width)[2], stable=True).astype(jnp.int32)

rows = []
for num_s, splits, nq in ((8, 2, 16), (16, 8, 1), (8, 16, 1), (16, 16, 16)):
    ctx = jnp.asarray([16384 * (2 * i + 1) // num_s for i in range(num_s)], jnp.int32)
    w = num_s * splits
    fo = jax.jit(lambda c: old_order(c, nq, w)); fn = jax.jit(lambda c: runs.part_order(c, nq, w))
    a, b = np.asarray(fo(ctx)), np.asarray(fn(ctx))
    assert (a == b).all(), (num_s, splits, a, b)
    for name, fn_ in (("argsort", fo), ("rank", fn), ("argsort", fo), ("rank", fn)):
        t = bench_util.traced_device_time(fn_, ctx, calls=20)
        t = t or dict(busy_us=float("nan"), kernels=0)
        rows.append(dict(S=num_s, W=w, form=name, device_us=round(t["busy_us"], 2), kernels=t["kernels"]))
        print(rows[-1], flush=True)
print(bench_util.markdown_table(rows, ["S", "W", "form", "device_us", "kernels"]))
