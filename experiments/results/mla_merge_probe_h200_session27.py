"""The split runs' merge at the mosaic_gpu decode shapes (session 27 form of session 26's probe):
XLA (`combine_splits` + astype) against the one-kernel Pallas:Triton merge in both forms
(merge.merge_splits form="rows", the timed default, kc 16 / 32 x 1 warp; form="parts", one pass
over [kc, 8, BC] tiles, first timed here) at several (kc, warps). bf16 parts [K, S, 64, 512] and lse2 [K, S, 64] as the kernel writes them, a
few parts empty; each checked against a float64 merge first; device time per call from the
profiler trace (kernels, us).
  PYTHONPATH=$PWD python3 <this file> > $OUT/merge.log
"""
import itertools
import sys

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax import bench_util
from pallas_kernels.mla_attention import merge, mosaic_gpu

SHAPES = ((64, 1), (65, 1), (132, 1), (16, 8), (8, 16), (8, 1))   # (K runs, S streams): auto's picks + one


def golden(o, lse):
    o, lse = np.asarray(o, np.float64), np.asarray(lse, np.float64)
    top = lse.max(0)
    w = np.exp2(lse - np.where(np.isfinite(top), top, 0.0))
    den = w.sum(0)
    return (w[..., None] * o).sum(0) / np.where(den > 0, den, 1.0)[..., None]


def xla_normalised_first(o, lse):
    """combine_splits with the weights divided by their sum before the weighted sum (elementwise on
    [K, S, R]), so the big reduction's output needs only the bf16 cast: can XLA fuse it in fewer kernels?"""
    top = lse.max(axis=0)
    w = jnp.exp2(lse - jnp.where(jnp.isfinite(top), top, 0.0))
    den = w.sum(axis=0)
    w = w / jnp.where(den > 0, den, 1.0)
    return (w[..., None] * o.astype(jnp.float32)).sum(axis=0).astype(jnp.bfloat16)


def main():
    rng = np.random.default_rng(0)
    rows = []
    for k, s in SHAPES:
        o = jnp.asarray(rng.standard_normal((k, s, 64, 512)), jnp.bfloat16)
        lse = (rng.standard_normal((k, s, 64)) * 4).astype(np.float32)
        lse[-1] = -np.inf                        # the last run empty, as at 65 pairs in 64 runs
        want = golden(o, lse)
        lse = jnp.asarray(lse)
        impls = {"xla": jax.jit(lambda o, l: mosaic_gpu.combine_splits(o, l).astype(jnp.bfloat16)),
                 "xla normalised first": jax.jit(xla_normalised_first)}
        forms = [("rows", 16, 1), ("rows", 32, 1)] + [("parts", kc, w) for kc, w in
                                                       itertools.product((8, 16, 32), (2, 4, 8))]
        for form, kc, warps in forms:
            impls[f"{form} kc{kc} w{warps}"] = jax.jit(
                lambda o, l, kc=kc, warps=warps, form=form: merge.merge_splits(o, l, jnp.bfloat16, kc=kc,
                                                                              warps=warps, form=form))
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
