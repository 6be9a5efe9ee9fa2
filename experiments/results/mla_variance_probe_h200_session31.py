"""Probe (session 31): does the Mosaic GPU MLA kernel's time at a memory-bound decode shape move
with the cache buffer it reads, or with the compiled call? Session 30 saw 32k decode S 16 take
154 us in one compiled call and 174 us in another of the same run (session 29's sweep: 166.5).

Per shape: 5 freshly allocated caches (same shape, new random values), the kernel alone
(context_attention, `launch`'s cluster and runs), each traced for 20 back-to-back calls (device us
per call: min, median, max), with the cache's device address modulo 2 MiB; then the compiled
cache is dropped (jax.clear_caches) and caches 0 and 1 are timed again with a fresh compile.

    PYTHONPATH=$PWD python3 experiments/results/mla_variance_probe_h200_session31.py
"""
import functools
import json
import tempfile

import jax
import numpy as np

from ddtree_jax import bench_util, model
from experiments.mla_bench import make_inputs
from pallas_kernels.mla_attention import mosaic_gpu


def kernel_us(fn, ops, calls: int = 20) -> list[float]:
    """Device us of each of `calls` traced calls of fn(*ops) (the Mosaic kernel's events)."""
    jax.block_until_ready(fn(*ops))
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            for _ in range(calls):
                out = fn(*ops)
            jax.block_until_ready(out)
        kernels, _ = bench_util.device_kernels(d)
    return [k["dur"] for k in kernels if "mosaic" in k["name"]]


rows = []
for ctx, num_q, num_s in [(32768, 1, 16), (8192, 1, 16)]:
    slots = model.aligned_slots(ctx + num_q)
    caches = [jax.jit(mosaic_gpu.prepare)(*make_inputs(jax.random.key(100 + i), num_s, num_q, 64, 576, ctx, slots, 1)[0])
              for i in range(5)]
    cluster, splits = mosaic_gpu.launch(*caches[0][:2])
    make = lambda: jax.jit(functools.partial(mosaic_gpu.context_attention, num_q=num_q, scale=576 ** -0.5,  # noqa: E731
                                             v_dim=512, cluster=cluster, splits=splits))
    fn = make()
    for compile_no, which in ((0, range(5)), (1, range(2))):
        if compile_no:
            jax.clear_caches()
            fn = make()
        for i in which:
            us = kernel_us(fn, caches[i])
            ptr = caches[i][1].unsafe_buffer_pointer()
            row = dict(ctx=ctx, q=num_q, s=num_s, splits=splits, compile=compile_no, cache=i,
                       addr_mod_2mib=ptr % (2 << 20), calls=len(us), min=min(us), median=float(np.median(us)),
                       max=max(us))
            rows.append(row)
            print(json.dumps(row), flush=True)
print("| ctx | Q | S | compile | cache | addr % 2 MiB | min us | median us | max us |")
for r in rows:
    print(f"| {r['ctx']} | {r['q']} | {r['s']} | {r['compile']} | {r['cache']} | {r['addr_mod_2mib']} | "
          f"{r['min']:.1f} | {r['median']:.1f} | {r['max']:.1f} |")
