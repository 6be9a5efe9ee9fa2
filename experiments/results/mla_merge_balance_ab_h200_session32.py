"""A/B (session 32): the split runs' Pallas merge alone (merge.merge_splits, form "rows" at 8-16
runs per stream), device us: without balance, with balance at kc 16 (the default step), and
with balance at merge_splits' default step. The run that produced the log beside this script
had a trial change in merge_splits (with balance, kc at most the mean runs per stream: 8 at S
16) that made no difference (3.58 us either way) and was not kept, so on main "on" and "on kc16"
are the same kernel. Parts from mosaic_gpu.context_attention at decode shapes, equal and spread contexts
(mla_bench.stream_contexts); each merge checked against XLA's combine_splits first. Four
alternating traced rounds of 40 calls, medians.

    PYTHONPATH=$PWD python3 experiments/results/mla_merge_balance_ab_h200_session32.py
"""
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax import bench_util, model
from experiments.mla_bench import make_inputs, stream_contexts
from pallas_kernels.mla_attention import merge, mosaic_gpu

rows = []
for ctx, num_s, lengths in [(8192, 16, "uniform"), (8192, 8, "uniform"), (8192, 16, "spread"), (8192, 8, "spread")]:
    contexts = stream_contexts(ctx, num_s, lengths)
    args = make_inputs(jax.random.key(ctx + num_s), num_s, 1, 64, 576, contexts,
                       model.aligned_slots(max(contexts) + 1), 1)[0]
    ops = jax.jit(mosaic_gpu.prepare)(*args)
    cluster, splits = mosaic_gpu.launch(*ops[:2])
    kw = dict(num_q=1, scale=576 ** -0.5, v_dim=512, cluster=cluster, splits=splits)
    parts = {b: jax.jit(functools.partial(mosaic_gpu.context_attention, balance=b, **kw))(*ops)[:2]
             for b in (False, True)}
    fns = {"off": (False, jax.jit(functools.partial(merge.merge_splits, out_dtype=jnp.bfloat16, num_q=1))),
           "on kc16": (True, jax.jit(functools.partial(merge.merge_splits, out_dtype=jnp.bfloat16, num_q=1,
                                                       balance=True, kc=16))),
           "on": (True, jax.jit(functools.partial(merge.merge_splits, out_dtype=jnp.bfloat16, num_q=1,
                                                  balance=True)))}
    err = {}
    for name, (b, f) in fns.items():
        want = np.asarray(mosaic_gpu.combine_splits(*parts[b], ops[2], num_q=1, balance=b))
        got = np.asarray(f(*parts[b], ops[2]).astype(jnp.float32))
        err[name] = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
    t = {k: [] for k in fns}
    for _ in range(4):
        for name, (b, f) in fns.items():
            t[name].append(bench_util.traced_device_time(f, *parts[b], ops[2], calls=40)["top"][0]["us"])
    row = dict(ctx=ctx, s=num_s, lengths=lengths, splits=splits, rel_err=err, us=t,
               med={k: float(np.median(v)) for k, v in t.items()})
    rows.append(row)
    print(json.dumps(row), flush=True)
print("| ctx | S | lengths | runs | off us | on, kc 16 us | on us | max rel err |")
for r in rows:
    m = r["med"]
    print(f"| {r['ctx']} | {r['s']} | {r['lengths']} | {r['splits']} | {m['off']:.2f} | {m['on kc16']:.2f} | "
          f"{m['on']:.2f} | {max(r['rel_err'].values()):.1e} |")
