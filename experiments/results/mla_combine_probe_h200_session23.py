"""Probe (written in session 21, run in session 23): mosaic_gpu's split-run merge, in device time.

Variants: (a) mosaic_gpu.combine_splits + astype (what mla_attention_mosaic runs now), (b) the
normalised weights first, then one weighted sum over the runs, (c) one Pallas:Triton kernel that
merges BR rows per program and writes the output dtype; (c16) the same on bf16 parts
(what the kernel would write instead of float32). Each checked against a float64 merge.
  PYTHONPATH=$PWD python3 experiments/results/mla_combine_probe_h200_session23.py   # GPU: device times; CPU: interpret check
"""
import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.mla_attention import mosaic_gpu
from pallas_kernels.pallas_compat import interpret_mode, pl, plgpu


def combine_b(o, lse):
    top = lse.max(axis=0)
    w = jnp.exp2(lse - jnp.where(jnp.isfinite(top), top, 0.0))
    den = w.sum(axis=0)
    wn = w / jnp.where(den > 0, den, 1.0)
    return jnp.einsum("ksr,ksrv->srv", wn, o, preferred_element_type=jnp.float32).astype(jnp.bfloat16)


def combine_c(o, lse, br=16):
    k, s, r, v = o.shape

    def kernel(o_ref, lse_ref, out_ref):
        si, b = pl.program_id(0), pl.program_id(1)
        rows = pl.ds(b * br, br)
        ls = [lse_ref[i, si, rows] for i in range(k)]
        top = ls[0]
        for x in ls[1:]:
            top = jnp.maximum(top, x)
        top = jnp.where(top == -jnp.inf, 0.0, top)
        acc = jnp.zeros((br, v), jnp.float32)
        den = jnp.zeros((br,), jnp.float32)
        for i in range(k):
            w = jnp.exp2(ls[i] - top)
            den = den + w
            acc = acc + w[:, None] * o_ref[i, si, rows, :].astype(jnp.float32)
        out_ref[si, rows, :] = (acc / jnp.where(den > 0, den, 1.0)[:, None]).astype(out_ref.dtype)

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((s, r, v), jnp.bfloat16), grid=(s, r // br),
                          compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1),
                          interpret=interpret_mode())(o, lse)


def golden(o, lse):
    o, lse = np.asarray(o, np.float64), np.asarray(lse, np.float64)
    top = lse.max(0)
    w = np.exp2(lse - np.where(np.isfinite(top), top, 0))
    return (w[..., None] * o).sum(0) / np.maximum(w.sum(0), 1e-300)[..., None]


def main():
    on_gpu = jax.default_backend() == "gpu"
    shapes = [(64, 1, 64), (16, 8, 64), (8, 16, 64), (132, 1, 64), (2, 1, 4096)] if on_gpu else [(3, 2, 32)]
    v = 512 if on_gpu else 64
    variants = dict(a=lambda o, l: mosaic_gpu.combine_splits(o, l).astype(jnp.bfloat16), b=combine_b, c=combine_c, c16=combine_c)
    if on_gpu:
        sys.path.insert(0, ".")
        from experiments.mla_bench import traced_in_graph
    for k, s, r in shapes:
        key = jax.random.key(k * 100 + s)
        sets = []
        for kk in jax.random.split(key, 4):
            a, b = jax.random.split(kk)
            o = jax.random.normal(a, (k, s, r, v), jnp.float32)
            lse = jax.random.uniform(b, (k, s, r), jnp.float32, -4, 4)
            lse = lse.at[-1, 0, :4].set(-jnp.inf)          # an empty run
            sets.append((o, lse))
        want = golden(*sets[0])
        line = f"K={k} S={s} R={r}:"
        sets16 = [(o.astype(jnp.bfloat16), lse) for o, lse in sets]     # parts written in bf16 (c16)
        for name, fn in variants.items():
            f = jax.jit(fn)
            use = sets16 if name == "c16" else sets
            got = np.asarray(f(*use[0]), np.float64)
            err = np.linalg.norm(got - want) / np.linalg.norm(want)
            assert err < 1e-2, (name, err)
            line += f"  {name} err {err:.1e}"
            if on_gpu:
                t = traced_in_graph(f, use)
                line += f" {t['busy_us']:.1f} us device ({t['kernels']:.0f} kernels)"
        print(line, flush=True)


if __name__ == "__main__":
    main()
