"""Session 51 (BENCHMARKS.md issue 5; logs beside it): mosaic_gpu taking a run's half pair (its
tail's last tile, when the tail has an odd number of tiles) first instead of last, as main does.
The idea: last, one consumer's softmax of that tile runs with no load in flight; first, it would
overlap the next tiles' loads. Rejected: 18-28% slower at Q 16 and 64, decode unchanged (probe8k.log;
no spills in the GPU tests): every later pair had its first-scored tile in the slot the producer
fills second. main since session 51 takes the half pair first from slot 1 instead
(mla_half_pair_slot1_h200_session51/). Both modules are loaded here from files, without
registering: 25f0be8's mosaic_gpu.py ("last (25f0be8)", main's when this ran) and it with
half_pair_first.diff applied ("first"). Whole mla_attention_mosaic calls (prepare, kernel, merge) at
the goal shapes whose runs hold half a pair (ctx 8k / 32k, Q 1 / 16 / 64, S 1 / 8 / 16: tail tiles
1), device time from a profiler trace of 20 calls after 4, A / B / A / B; each variant's output
checked against the xla implementation first. The cache has ctx + Q + 64 slots, not the model's
aligned count, so each call also pads it (loop_pad_fusion, in both variants alike).
  git show 25f0be8:pallas_kernels/mla_attention/mosaic_gpu.py > /tmp/last.py
  cp /tmp/last.py /tmp/first.py
  patch /tmp/first.py experiments/results/mla_half_pair_first_h200_session51/half_pair_first.diff
  python3 experiments/results/mla_half_pair_first_h200_session51/probe.py /tmp/last.py /tmp/first.py [8192,32768]
(the optional third argument: the contexts, comma-separated; the run: s51b.sh, 8192 only).
"""
import functools
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax import bench_util
from pallas_kernels.mla_attention import mla_attention, visibility_to_mask

CONTEXTS = (8192, 32768)


def load_module(path):
    """The module at path without its registry decorators (main's module already holds the names)."""
    src = open(path).read()
    for deco in ('@registry.register("mla_attention", "mosaic_gpu", supports=supports)\n',
                 '@registry.chooser("mla_attention")\n'):
        assert src.count(deco) == 1, deco
        src = src.replace(deco, "")
    module = types.ModuleType(f"mosaic_gpu_{len(path)}_{abs(hash(path))}")
    exec(compile(src, path, "exec"), module.__dict__)
    return module


def rel(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def main(argv):
    last, first = load_module(argv[1]), load_module(argv[2])
    contexts = [int(c) for c in argv[3].split(",")] if len(argv) > 3 else CONTEXTS
    shapes = [(ctx, q, s) for ctx in contexts for q in (1, 16, 64) for s in (16, 8, 1)]
    variants = {"last (25f0be8)": last.mla_attention_mosaic, "first": first.mla_attention_mosaic}
    rng = np.random.default_rng(51)
    h, dk, v = 64, 576, 512
    scale = dk ** -0.5
    rows = []
    for ctx, num_q, num_s in shapes:
        q = jnp.asarray(rng.standard_normal((num_s, num_q, h, dk)), jnp.bfloat16)
        kv = jnp.asarray(rng.standard_normal((num_s, ctx + num_q + 64, dk)), jnp.bfloat16)
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
