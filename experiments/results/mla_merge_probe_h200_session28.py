"""Record of session 28's run (log beside it). merge_masked.py was a git-ignored dev copy of
merge.py; its masked last step is main's merge.py since session 28, so this file no longer runs as is.

Session 28 (prepared in session 27): the "parts" merge form as on main (the last step re-reads
parts at K - kc) against runs/dev/merge/merge_masked.py (the last step masks the parts past K:
predicated loads, no re-read; CPU interpret tests pass, 234 registers, 992 instructions per step
against 976, no spills), both at kc 32 x 4 warps, at split_count's run counts; XLA as the anchor.
  PYTHONPATH=$PWD python3 runs/dev/merge/mla_merge_probe28.py > $OUT/merge28.log
"""
import importlib.util
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax import bench_util
from pallas_kernels.mla_attention import merge, mosaic_gpu

spec = importlib.util.spec_from_file_location("merge_masked", os.path.join(os.path.dirname(__file__), "merge_masked.py"))
masked = importlib.util.module_from_spec(spec)
spec.loader.exec_module(masked)

SHAPES = ((18, 7), (26, 5), (33, 4), (44, 3), (65, 1), (65, 2), (132, 1), (17, 1), (24, 1))


def golden(o, lse):
    o, lse = np.asarray(o, np.float64), np.asarray(lse, np.float64)
    top = lse.max(0)
    w = np.exp2(lse - np.where(np.isfinite(top), top, 0.0))
    den = w.sum(0)
    return (w[..., None] * o).sum(0) / np.where(den > 0, den, 1.0)[..., None]


def main():
    rng = np.random.default_rng(0)
    rows = []
    for k, s in SHAPES:
        o = jnp.asarray(rng.standard_normal((k, s, 64, 512)), jnp.bfloat16)
        lse = (rng.standard_normal((k, s, 64)) * 4).astype(np.float32)
        lse[-1] = -np.inf
        want = golden(o, lse)
        lse = jnp.asarray(lse)
        impls = {"xla": jax.jit(lambda o, l: mosaic_gpu.combine_splits(o, l).astype(jnp.bfloat16)),
                 "rows kc16 w1": jax.jit(lambda o, l: merge.merge_splits(o, l, jnp.bfloat16, form="rows")),
                 "parts re-read": jax.jit(lambda o, l: merge.merge_splits(o, l, jnp.bfloat16, form="parts")),
                 "parts masked": jax.jit(lambda o, l: masked.merge_splits(o, l, jnp.bfloat16, form="parts"))}
        for name, fn in impls.items():
            got = np.asarray(fn(o, lse), np.float64)
            err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
            if not err < 8e-3:
                raise AssertionError(f"K{k} S{s} {name}: rel err {err:.1e}")
            t = bench_util.traced_device_time(fn, o, lse, calls=20)
            rows.append(dict(K=k, S=s, impl=name, rel_err=err, device_us=t["busy_us"], kernels=t["kernels"]))
            print(rows[-1], flush=True)
    print(f"device {jax.devices()[0].device_kind}  jax {jax.__version__}")
    print(bench_util.markdown_table(rows, ["K", "S", "impl", "device_us", "kernels", "rel_err"]))


if __name__ == "__main__":
    sys.exit(main())
