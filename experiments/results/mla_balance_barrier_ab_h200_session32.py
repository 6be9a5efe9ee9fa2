"""A/B (session 32): the Mosaic GPU MLA kernel alone, device us, balance=False against
balance=True, after the run schedule's results pass through lax.optimization_barrier (ptxas had
spilled 136 / 504 bytes at S 16 with balance, none without). Split decode shapes, equal contexts
(both schedules give the same runs: the merged outputs are compared) and spread ones
(mla_bench.stream_contexts). Four alternating traced rounds of 40 calls each, medians.

    PYTHONPATH=$PWD python3 experiments/results/mla_balance_barrier_ab_h200_session32.py
"""
import functools
import json

import jax
import numpy as np

from ddtree_jax import bench_util, model
from experiments.mla_bench import make_inputs, stream_contexts
from pallas_kernels.mla_attention import mosaic_gpu

rows = []
for ctx, num_s, lengths in [(8192, 16, "uniform"), (8192, 8, "uniform"), (16384, 16, "uniform"),
                            (16384, 16, "spread"), (16384, 8, "spread")]:
    contexts = stream_contexts(ctx, num_s, lengths)
    args = make_inputs(jax.random.key(ctx + num_s), num_s, 1, 64, 576, contexts,
                       model.aligned_slots(max(contexts) + 1), 1)[0]
    ops = jax.jit(mosaic_gpu.prepare)(*args)
    cluster, splits = mosaic_gpu.launch(*ops[:2])
    kw = dict(num_q=1, scale=576 ** -0.5, v_dim=512, cluster=cluster, splits=splits)
    fns = {b: jax.jit(functools.partial(mosaic_gpu.context_attention, balance=b, **kw)) for b in (False, True)}
    merged = {b: np.asarray(mosaic_gpu.merge_runs(*fns[b](*ops), ops[2], np.float32, num_q=1, balance=b))
              for b in (False, True)}
    diff = float(np.max(np.abs(merged[True] - merged[False])))
    t = {False: [], True: []}
    for _ in range(4):
        for b, f in fns.items():
            t[b].append(bench_util.traced_device_time(f, *ops, calls=40)["top"][0]["us"])
    row = dict(ctx=ctx, s=num_s, lengths=lengths, splits=splits, max_abs_diff=diff, plain=t[False],
               balanced=t[True], plain_med=float(np.median(t[False])), balanced_med=float(np.median(t[True])))
    rows.append(row)
    print(json.dumps(row), flush=True)
print("| ctx | S | lengths | runs | merged max abs diff | balance off us | balance on us |")
for r in rows:
    print(f"| {r['ctx']} | {r['s']} | {r['lengths']} | {r['splits']} | {r['max_abs_diff']:.1e} | "
          f"{r['plain_med']:.2f} | {r['balanced_med']:.2f} |")
