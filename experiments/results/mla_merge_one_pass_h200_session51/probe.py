"""Session 51 (BENCHMARKS.md issue 5; logs beside it): the "rows" merge in one pass against the
two passes on main (merge._kernel: the row maxima from lse2 first, then lse2 again and the weighted
O, two memory round trips). The one-pass variant, copied below (it was merge.py's `_kernel`
while this ran), loads each step's kc lse rows and O tiles together and rescales the running sums
online, one round trip per step. Rejected: equal at 8k decode S 16, slower where a step holds 16
parts or 4 warps share a program. Device time from a profiler trace, merge alone at split_count's
run counts of the goal shapes that take the "rows" form, then whole mosaic_gpu decode calls at
8k, S 16 and S 8 (the same kernel, either merge), A / B alternating twice. Every figure is checked
first (merge: float64 numpy; whole call: the xla implementation).
Run (device): python3 experiments/results/mla_merge_one_pass_h200_session51/probe.py
(s51a.sh beside it: the whole call, with mla_bench and the GPU tests run after it). In the log's
kernels column the two-pass kernel is named _kernel_two_pass and the one-pass one _kernel, their
names in that run.
"""
import contextlib
import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from ddtree_jax import bench_util
from pallas_kernels.mla_attention import merge, mla_attention, mosaic_gpu, runs
from pallas_kernels.pallas_compat import plgpu

# (S, parts per stream K, rows R, balance, num_q): 8k decode S 16 / S 8, 8k Q 16 S 1, 8k Q 64 S 1,
# and a balanced spread-context shape of session 33.
SHAPES = ((16, 8, 64, False, 1), (8, 16, 64, False, 1), (1, 8, 1024, False, 16), (1, 2, 4096, False, 64),
          (8, 2, 1024, True, 16))


def _kernel_one_pass(o_ref, lse_ref, ctx_ref, *refs, num_q: int, balance: bool, br: int, bc: int, kc: int):
    out_ref = refs[-1]                                  # refs: (out,) or (aliased out, out)
    s, rb, cb = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    rows, cols = pl.ds(rb * br, br), pl.ds(cb * bc, bc)
    first, parts = merge._stream_parts(ctx_ref, num_q, o_ref.shape[0], balance)
    steps = -(-parts // kc) if isinstance(parts, int) else jax.lax.div(parts + kc - 1, kc)

    def step(c, carry):
        # The step's kc lse rows and O tiles are loaded together (parts past the stream's:
        # predicated off), so the step costs one memory round trip; the running sums are then
        # rescaled to the new row maxima (online, as flash attention does).
        top, acc, den = carry                                                          # [br], [br, bc], [br]
        ks = [c * kc + i for i in range(kc)]
        at = [first + jnp.minimum(k, parts - 1) for k in ks]
        lse = [plgpu.load(lse_ref.at[a, rows], mask=jnp.full((br,), k < parts), other=-jnp.inf)
               for a, k in zip(at, ks)]
        o = [plgpu.load(o_ref.at[a, rows, cols], mask=jnp.full((br, bc), k < parts), other=0)
             for a, k in zip(at, ks)]
        new_top = functools.reduce(jnp.maximum, lse, top)
        ref = jnp.where(new_top == -jnp.inf, 0.0, new_top)                             # no key yet: weights 0
        keep = jnp.exp2(top - ref)
        acc, den = acc * keep[:, None], den * keep
        for lse_k, o_k in zip(lse, o):
            w = jnp.exp2(lse_k - ref)
            acc, den = acc + w[:, None] * o_k.astype(jnp.float32), den + w
        return new_top, acc, den

    init = (jnp.full((br,), -jnp.inf, jnp.float32), jnp.zeros((br, bc), jnp.float32), jnp.zeros((br,), jnp.float32))
    _, acc, den = jax.lax.fori_loop(0, steps, step, init)
    out_ref[s, rows, cols] = (acc / jnp.where(den > 0, den, 1.0)[:, None]).astype(out_ref.dtype)


@contextlib.contextmanager
def merge_kernel(kernel):
    """merge.merge_splits traced with `kernel` as its "rows" kernel; mosaic_gpu calls it unjitted
    meanwhile (the jitted merge_splits would reuse its first trace for the second variant)."""
    saved = merge._kernel, mosaic_gpu.merge_splits
    merge._kernel, mosaic_gpu.merge_splits = kernel, merge.merge_splits.__wrapped__
    try:
        yield
    finally:
        merge._kernel, mosaic_gpu.merge_splits = saved


VARIANTS = {"two_pass": merge._kernel, "one_pass": _kernel_one_pass}


def compiled(kernel, fn, *args):
    """fn(*args) compiled with `kernel` as the merge's "rows" kernel (a new function object each
    time: jit caches traces by the function, so jitting fn itself twice would reuse the first)."""
    with merge_kernel(kernel):
        return jax.jit(lambda *a: fn(*a)).lower(*args).compile()


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


def rel(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def merge_rows(rng):
    rows = []
    for num_s, k, r, balance, nq in SHAPES:
        ctx = jnp.asarray([16384 * (2 * i + 1) // num_s for i in range(num_s)] if balance else [8192] * num_s,
                          jnp.int32)
        width = num_s * k
        stream = np.asarray(runs.part_runs(ctx, nq, width, balance)[0])
        o = jnp.asarray(rng.standard_normal((width, r, 512)), jnp.bfloat16)
        lse = (rng.standard_normal((width, r)) * 4).astype(np.float32)
        lse[0, :3] = -np.inf
        lse = jnp.asarray(lse)
        want = golden(o, lse, stream, num_s)
        fn = functools.partial(merge.merge_splits.__wrapped__, out_dtype=jnp.bfloat16, num_q=nq, balance=balance)
        fns = {name: compiled(kern, fn, o, lse, ctx) for name, kern in VARIANTS.items()}
        for rnd in range(2):
            for name, f in fns.items():
                err = rel(f(o, lse, ctx), want)
                if not err < 8e-3:
                    raise AssertionError(f"S{num_s} K{k} R{r} {name}: rel err {err:.1e}")
                t = bench_util.traced_device_time(f, o, lse, ctx, calls=20, warm=4)
                rows.append(dict(what="merge", S=num_s, K=k, R=r, balance=balance, round=rnd, variant=name,
                                 br=merge.rows_per_program(num_s, r, "rows"), device_us=round(t["busy_us"], 2),
                                 rel_err=f"{err:.1e}"))
                print(rows[-1], flush=True)
    return rows


def call_rows(rng):
    rows = []
    for num_s in (16, 8):
        ctx, h, dk, v = 8192, 64, 576, 512
        q = jnp.asarray(rng.standard_normal((num_s, 1, h, dk)), jnp.bfloat16)
        kv = jnp.asarray(rng.standard_normal((num_s, ctx + 64, dk)), jnp.bfloat16)
        lens = jnp.full((num_s,), ctx, jnp.int32)
        mask = jnp.ones((num_s, 1, 1), jnp.int32)
        scale = dk ** -0.5
        want = mla_attention(q, kv, lens, mask, scale=scale, v_dim=v, impl="xla")
        fn = functools.partial(mosaic_gpu.mla_attention_mosaic.__wrapped__, scale=scale, v_dim=v)
        fns = {name: compiled(kern, fn, q, kv, lens, mask) for name, kern in VARIANTS.items()}
        for rnd in range(2):
            for name, f in fns.items():
                err = rel(f(q, kv, lens, mask), want)
                if not err < 8e-3:
                    raise AssertionError(f"decode S{num_s} {name}: rel err {err:.1e}")
                t = bench_util.traced_device_time(f, q, kv, lens, mask, calls=20, warm=4)
                top = {k["name"][:24]: round(k["us"], 2) for k in t["top"]}
                rows.append(dict(what="decode 8k", S=num_s, K=mosaic_gpu.split_count(num_s, 1, ctx + 64), R=64,
                                 round=rnd, variant=name, device_us=round(t["busy_us"], 2), kernels=str(top),
                                 rel_err=f"{err:.1e}"))
                print(rows[-1], flush=True)
    return rows


def main():
    rng = np.random.default_rng(51)
    rows = merge_rows(rng) + call_rows(rng)
    print(f"device {jax.devices()[0].device_kind}  jax {jax.__version__}")
    print(bench_util.markdown_table(rows, ["what", "S", "K", "R", "balance", "round", "variant", "device_us",
                                           "kernels", "rel_err"]))


if __name__ == "__main__":
    sys.exit(main())
