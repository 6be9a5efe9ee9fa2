"""The split runs' merge at the run counts split_count gives at 8k / 32k decode, S 1-14 (session 27, second probe):
XLA (`combine_splits` + astype) against the one-kernel Pallas:Triton merge in both forms
(merge.merge_splits form="rows", kc 16 x 1 warp; form="parts", one pass over [kc, 8, BC] tiles, at
kc 16 / 32 x 2 / 4 warps) and merge_splits' default (form_for's pick). bf16 parts [K, S, 64, 512]
and lse2 [K, S, 64] as the kernel writes them, the last run empty; each checked against a float64 merge first; device time per call from the
profiler trace (kernels, us).
  PYTHONPATH=$PWD python3 <this file> > $OUT/merge.log
"""
import sys

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax import bench_util
from pallas_kernels.mla_attention import merge, mosaic_gpu

SHAPES = ((18, 7), (22, 6), (26, 5), (33, 4), (44, 3), (65, 2), (66, 2), (132, 1), (16, 8), (9, 14))   # split_count at 8k / 32k decode


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
        lse[-1] = -np.inf                        # the last run empty, as at 65 pairs in 64 runs
        want = golden(o, lse)
        lse = jnp.asarray(lse)
        impls = {"xla": jax.jit(lambda o, l: mosaic_gpu.combine_splits(o, l).astype(jnp.bfloat16))}
        forms = [("rows", 16, 1), ("parts", 16, 4), ("parts", 32, 2), ("parts", 32, 4)]
        for form, kc, warps in forms:
            impls[f"{form} kc{kc} w{warps}"] = jax.jit(
                lambda o, l, kc=kc, warps=warps, form=form: merge.merge_splits(o, l, jnp.bfloat16, kc=kc,
                                                                              warps=warps, form=form))
        impls[f"default ({merge.form_for(k)})"] = jax.jit(lambda o, l: merge.merge_splits(o, l, jnp.bfloat16))
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
