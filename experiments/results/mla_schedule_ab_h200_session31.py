"""A/B (session 31): the Mosaic GPU MLA kernel alone, device us, with the length-balanced run
schedule ("new": context_attention(balance=True), runs.run_of computed in the kernel from every
stream's context; run before the flag existed, when it was the only schedule) against
the kernel before it ("old": splits runs for every stream, 40b22a9's mosaic_gpu.py copied to
runs/dev/ab/mosaic_gpu_old.py), at split decode shapes with equal contexts (the two share the
CTAs out identically there) and spread ones (mla_bench.stream_contexts). Four alternating
traced rounds of 40 calls each, medians; the new kernel's merged output is checked against the
old one's where the contexts are equal.

    git show 40b22a9:pallas_kernels/mla_attention/mosaic_gpu.py > runs/dev/ab/mosaic_gpu_old.py
    PYTHONPATH=$PWD python3 experiments/results/mla_schedule_ab_h200_session31.py
"""
import functools
import json
import sys

import jax
import numpy as np

sys.path.insert(0, "runs/dev/ab")
import mosaic_gpu_old as old
from ddtree_jax import bench_util, model
from experiments.mla_bench import make_inputs, stream_contexts
from pallas_kernels.mla_attention import mosaic_gpu as new

rows = []
for ctx, num_s, lengths in [(16384, 16, "uniform"), (16384, 16, "spread"), (16384, 8, "uniform"), (8192, 16, "uniform")]:
    contexts = stream_contexts(ctx, num_s, lengths)
    args = make_inputs(jax.random.key(ctx + num_s), num_s, 1, 64, 576, contexts,
                       model.aligned_slots(max(contexts) + 1), 1)[0]
    ops = jax.jit(new.prepare)(*args)
    cluster, splits = new.launch(*ops[:2])
    kw = dict(num_q=1, scale=576 ** -0.5, v_dim=512, cluster=cluster, splits=splits)
    fns = {"old": jax.jit(functools.partial(old.context_attention, **kw)),
           "new": jax.jit(functools.partial(new.context_attention, balance=True, **kw))}
    o_new = new.combine_splits(*fns["new"](*ops), ops[2], num_q=1, balance=True)
    o_old = old.combine_splits(*fns["old"](*ops))
    diff = float(np.max(np.abs(np.asarray(o_new) - np.asarray(o_old))))
    t = {"old": [], "new": []}
    for _ in range(4):
        for k, f in fns.items():
            t[k].append(bench_util.traced_device_time(f, *ops, calls=40)["top"][0]["us"])
    row = dict(ctx=ctx, s=num_s, lengths=lengths, splits=splits, max_abs_diff=diff, old=t["old"], new=t["new"],
               old_med=float(np.median(t["old"])), new_med=float(np.median(t["new"])))
    rows.append(row)
    print(json.dumps(row), flush=True)
print("| ctx | S | lengths | runs | max abs diff | old us | new us |")
for r in rows:
    print(f"| {r['ctx']} | {r['s']} | {r['lengths']} | {r['splits']} | {r['max_abs_diff']:.1e} | "
          f"{r['old_med']:.2f} | {r['new_med']:.2f} |")
