"""How fast can a Pallas:Triton program stream the gate+up INT4 words, with no dequantisation?

The tuned gate_up kernel (bm 16, 64 columns, 4 warps, 3 stages) reads per program and 256-deep K
block two [32, 64] int32 word tiles (gate and up) of the kernel layout [E, K/8, N]: 32 rows of
256 bytes, 8 KB apart. It reaches ~70% of the copy bandwidth (BENCHMARKS.md, issue 4); the same
kernels on bf16 weights 75-85%. This probe separates the access pattern from the work in the SM.
Programs (used expert e, column tile n) walk the whole K, load the two tiles per step and fold
them into an int32 accumulator (XOR; stored at the end so the loads stay), in two layouts:
- rows:  the kernel layout as it is, [E, K/8, N]: 256-byte row pieces (bn 64);
- tiles: the same words tile-major, [E, N/bn, K/8, bn]: each step's tile one contiguous piece.
Per layout, columns per program (bn), warps and stages; device time from the profiler trace, GB/s
and % of the copy ceiling measured in the same run; each result checked against numpy first.

  python3 experiments/results/moe_stream_probe_h200_session26.py > $OUT/stream.log   # GPU; on a CPU: interpret check
"""
import functools
import itertools
import sys

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax import bench_util
from pallas_kernels.pallas_compat import interpret_mode, pl, plgpu

K, N, E_ALL, USED = 7168, 2048, 384, 111     # the K2 gate / up shape, T = 16's active experts
ROWS = 32                                     # word rows per 256-deep K block


def stream(gate, up, experts, *, layout: str, bn: int, warps: int, stages: int):
    """gate, up: int32 words ([E, K/8, N] rows, or [E, N/bn, K/8, bn] tiles); experts [P] int32 ->
    [P, 32, N] int32: per program the XOR of all its K blocks' gate and up tiles."""
    kw = gate.shape[-2] if layout == "tiles" else gate.shape[1]
    n_cols = gate.shape[1] * gate.shape[3] if layout == "tiles" else gate.shape[2]
    steps = kw // ROWS

    def kernel(e_ref, g_ref, u_ref, o_ref):
        p, n = pl.program_id(0), pl.program_id(1)
        e = e_ref[p]

        def tile(ref, kb):
            if layout == "tiles":
                return ref[e, n, pl.ds(kb * ROWS, ROWS), :]
            return ref[e, pl.ds(kb * ROWS, ROWS), pl.ds(n * bn, bn)]

        def body(kb, acc):
            return acc ^ tile(g_ref, kb) ^ tile(u_ref, kb)

        acc = jax.lax.fori_loop(0, steps, body, jnp.zeros((ROWS, bn), jnp.int32))
        o_ref[p, :, pl.ds(n * bn, bn)] = acc

    return pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((experts.shape[0], ROWS, n_cols), jnp.int32),
        grid=(experts.shape[0], n_cols // bn),
        compiler_params=plgpu.CompilerParams(num_warps=warps, num_stages=stages),
        interpret=interpret_mode())(experts, gate, up)


def tiled(w, bn):
    """[E, K/8, N] -> [E, N/bn, K/8, bn]."""
    e, kw, n = w.shape
    return w.reshape(e, kw, n // bn, bn).transpose(0, 2, 1, 3)


def golden(gate, up, experts):
    g, u = np.asarray(gate)[experts], np.asarray(up)[experts]           # [P, K/8, N]
    x = g ^ u
    return np.bitwise_xor.reduce(x.reshape(x.shape[0], -1, ROWS, x.shape[-1]), axis=1)


def main():
    on_gpu = jax.default_backend() == "gpu"
    k, n, e_all, used = (K, N, E_ALL, USED) if on_gpu else (512, 256, 6, 3)
    configs = (list(itertools.product(("rows", "tiles"), (64, 128), (4, 8), (2, 3, 4))) if on_gpu
               else [("rows", 64, 4, 2), ("tiles", 64, 4, 2)])
    keys = jax.random.split(jax.random.key(0), 3)
    bits = lambda key: jax.lax.bitcast_convert_type(  # noqa: E731
        jax.random.bits(key, (e_all, k // 8, n), jnp.uint32), jnp.int32)
    gate, up = bits(keys[0]), bits(keys[1])
    experts = jnp.sort(jax.random.permutation(keys[2], e_all)[:used]).astype(jnp.int32)
    want = golden(gate, up, np.asarray(experts))
    nbytes = 2 * used * (k // 8) * n * 4
    ceil = bench_util.measure_ceilings() if on_gpu else None
    if ceil:
        print(f"ceilings {ceil}  device {jax.devices()[0].device_kind}  jax {jax.__version__}", flush=True)
    rows = []
    for layout, bn, warps, stages in configs:
        g, u = (gate, up) if layout == "rows" else (tiled(gate, bn), tiled(up, bn))
        fn = jax.jit(functools.partial(stream, layout=layout, bn=bn, warps=warps, stages=stages))
        got = np.asarray(fn(g, u, experts))
        if not np.array_equal(got, want):
            raise AssertionError(f"{layout} bn {bn}: wrong result")
        row = dict(layout=layout, bn=bn, warps=warps, stages=stages, MB=nbytes / 1e6)
        if on_gpu:
            t = bench_util.traced_device_time(fn, g, u, experts, calls=20)
            us = t["top"][0]["us"]
            row.update(kernel_us=us, GBps=nbytes / us / 1e3,
                       pct_copy=100 * nbytes / (us * 1e-6) / (ceil["copy_tbps"] * 1e12))
        rows.append(row)
        print(row, flush=True)
    print(bench_util.markdown_table(rows, ["layout", "bn", "warps", "stages", "MB", "kernel_us", "GBps",
                                           "pct_copy"]))


if __name__ == "__main__":
    sys.exit(main())
