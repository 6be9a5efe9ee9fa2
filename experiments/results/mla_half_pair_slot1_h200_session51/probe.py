"""Session 51 (BENCHMARKS.md issue 5; logs beside it): mosaic_gpu taking a run's half pair (its
tail's last tile, when the tail has an odd number of tiles) first, from key slot 1, as main does
since session 51, against taking it last, as 25f0be8 did (that module given as the argument,
loaded without registering). Last, the run ends on one consumer's softmax of that tile with no
load in flight; first, the softmax overlaps the first pair's loads, and every later pair keeps its
first-scored tile in slot 0, which the producer fills first (the earlier try, from slot 0, made the
producer fill each pair's first-scored tile last: mla_half_pair_first_h200_session51/). Whole
mla_attention_mosaic calls (prepare, kernel, merge) at 8k and 32k goal shapes whose runs hold half
a pair, the cache at the model's aligned size (no pad), device time from a profiler trace of 20
calls after 4, A / B / A / B; each variant's output checked against the xla implementation first.
  git show 25f0be8:pallas_kernels/mla_attention/mosaic_gpu.py > /tmp/mosaic_gpu_25f0be8.py
  python3 experiments/results/mla_half_pair_slot1_h200_session51/probe.py /tmp/mosaic_gpu_25f0be8.py
"""
import functools
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax import bench_util
from pallas_kernels.mla_attention import mla_attention, mosaic_gpu, visibility_to_mask


def load_module(path):
    """The module at path without its registry decorators (main's already hold the names)."""
    src = open(path).read()
    for deco in ('@registry.register("mla_attention", "mosaic_gpu", supports=supports)\n',
                 '@registry.chooser("mla_attention")\n'):
        assert src.count(deco) == 1, deco
        src = src.replace(deco, "")
    module = types.ModuleType("mosaic_gpu_25f0be8")
    exec(compile(src, path, "exec"), module.__dict__)
    return module


def rel(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def main(argv):
    last = load_module(argv[1])
    shapes = [(8192, 1, 16), (8192, 1, 8), (8192, 16, 1), (8192, 16, 16), (8192, 64, 1), (8192, 1, 1), (32768, 1, 16),
              (32768, 16, 1)]
    variants = {"last (25f0be8)": last.mla_attention_mosaic, "first": mosaic_gpu.mla_attention_mosaic}
    rng = np.random.default_rng(51)
    h, dk, v = 64, 576, 512
    scale = dk ** -0.5
    rows = []
    for ctx, num_q, num_s in shapes:
        q = jnp.asarray(rng.standard_normal((num_s, num_q, h, dk)), jnp.bfloat16)
        kv = jnp.asarray(rng.standard_normal((num_s, ctx + 128 * (1 + num_q // 128), dk)), jnp.bfloat16)
        lens = jnp.full((num_s,), ctx, jnp.int32)
        vis = np.tril(rng.random((num_s, num_q, num_q)) < 0.5) | np.eye(num_q, dtype=bool)[None]
        mask = visibility_to_mask(jnp.asarray(vis))
        want = mla_attention(q, kv, lens, mask, scale=scale, v_dim=v, impl="xla")
        fns = {name: jax.jit(functools.partial(fn, scale=scale, v_dim=v)) for name, fn in variants.items()}
        for rnd in range(2):
            for name, fn in fns.items():
                err = rel(fn(q, kv, lens, mask), want)
                if not err < 8e-3:
                    raise AssertionError(f"ctx {ctx} Q {num_q} S {num_s} {name}: rel err {err:.1e}")
                t = bench_util.traced_device_time(fn, q, kv, lens, mask, calls=20, warm=4)
                top = {k["name"][:22]: round(k["us"], 2) for k in t["top"][:2]}
                rows.append(dict(ctx=ctx, Q=num_q, S=num_s, round=rnd, variant=name, device_us=round(t["busy_us"], 2),
                                 kernels=str(top), rel_err=f"{err:.1e}"))
                print(rows[-1], flush=True)
        del q, kv
    print(f"device {jax.devices()[0].device_kind}  jax {jax.__version__}")
    print(bench_util.markdown_table(rows, ["ctx", "Q", "S", "round", "variant", "device_us", "kernels", "rel_err"]))
    # per shape: mean of the two rounds, first / last
    print("\n| ctx | Q | S | last us | first us | first / last |\n|---:|---:|---:|---:|---:|---:|")
    for ctx, num_q, num_s in shapes:
        t = {n: np.mean([r["device_us"] for r in rows if (r["ctx"], r["Q"], r["S"], r["variant"]) == (ctx, num_q, num_s, n)])
             for n in variants}
        a, b = t["last (25f0be8)"], t["first"]
        print(f"| {ctx} | {num_q} | {num_s} | {a:.1f} | {b:.1f} | {b / a:.3f} |")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
