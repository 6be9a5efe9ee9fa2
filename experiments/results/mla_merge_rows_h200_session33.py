"""Session 33 (BENCHMARKS.md issue 5; log beside it): the merge's rows per program (br) and warps at
the merge shapes of split calls (S, parts per stream K, rows R, balance). Device time from a profiler trace,
20 calls; every row first matched against float64 numpy. Run (device): python3 <this file>."""
import sys

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax import bench_util
from pallas_kernels.mla_attention import merge, runs

SHAPES = ((8, 2, 1024, True), (1, 8, 1024, False), (16, 8, 64, False), (4, 3, 1024, True))


def golden(o, lse, stream, num_s):
    o, lse = np.asarray(o, np.float64), np.asarray(lse, np.float64)
    out = []
    for s in range(num_s):
        lo, ls = o[stream == s], lse[stream == s]
        top = ls.max(0)
        w = np.exp2(ls - np.where(np.isfinite(top), top, 0.0))
        den = w.sum(0)
        out.append((w[..., None] * lo).sum(0) / np.where(den > 0, den, 1.0)[..., None])
    return np.stack(out)


def main():
    rng = np.random.default_rng(0)
    rows = []
    for num_s, k, r, balance in SHAPES:
        ctx = jnp.asarray([16384 * (2 * i + 1) // num_s for i in range(num_s)] if balance else [8192] * num_s, jnp.int32)
        width = num_s * k
        stream = np.asarray(runs.part_runs(ctx, 16 if r > 64 else 1, width, balance)[0])
        o = jnp.asarray(rng.standard_normal((width, r, 512)), jnp.bfloat16)
        lse = jnp.asarray((rng.standard_normal((width, r)) * 4).astype(np.float32))
        want = golden(o, lse, stream, num_s)
        nq = 16 if r > 64 else 1
        for br, warps in ((8, 1), (8, 2), (16, 2), (32, 2), (32, 4), (64, 4), (64, 8)):
            if br > r:
                continue
            fn = jax.jit(lambda o, l, c, br=br, warps=warps: merge.merge_splits(
                o, l, c, jnp.bfloat16, num_q=nq, balance=balance, br=br, warps=warps))
            got = np.asarray(fn(o, lse, ctx), np.float64)
            err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
            if not err < 8e-3:
                raise AssertionError(f"S{num_s} K{k} R{r} br{br} w{warps}: rel err {err:.1e}")
            t = bench_util.traced_device_time(fn, o, lse, ctx, calls=20)
            rows.append(dict(S=num_s, K=k, R=r, balance=balance, br=br, warps=warps,
                             form=merge.form_for(k), device_us=round(t["busy_us"], 2), rel_err=f"{err:.1e}"))
            print(rows[-1], flush=True)
    print(f"device {jax.devices()[0].device_kind}  jax {jax.__version__}")
    print(bench_util.markdown_table(rows, ["S", "K", "R", "balance", "form", "br", "warps", "device_us", "rel_err"]))


if __name__ == "__main__":
    sys.exit(main())
