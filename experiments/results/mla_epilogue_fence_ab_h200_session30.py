"""A/B (session 30, not kept): the Mosaic GPU MLA kernel alone, device us, with O's epilogue as on
main ("old": each 64-column chunk staged in shared memory, fenced by commit_smem, then stored by
TMA) against one fence for all four staged chunks before their four TMA stores ("new"). Run with
732c29e's mosaic_gpu.py copied to runs/dev/ab/mosaic_gpu_old.py and the working tree's module
changed to the one-fence form:

    for j in range(half // 64):
        o_stage.at[w, j][...] = (acc[:, j * 64:(j + 1) * 64] * inv).astype(o_ref.dtype)
    plmg.commit_smem()
    for j in range(half // 64):
        plmg.copy_smem_to_gmem(o_stage.at[w, j], out_at(j))

The one-fence form was 0.03-0.29 us slower at every shape (log beside this file)."""
import functools
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, "runs/dev/ab")
import mosaic_gpu_old as old
from pallas_kernels.mla_attention import mosaic_gpu as new
from ddtree_jax import bench_util, model
from experiments.mla_bench import make_inputs

rows = []
for ctx, num_q, num_s, splits in [(8192, 1, 16, 8), (8192, 16, 1, 8), (32768, 1, 16, 8), (8192, 1, 1, 65)]:
    args = make_inputs(jax.random.key(ctx + num_q + num_s), num_s, num_q, 64, 576, ctx, model.aligned_slots(ctx + num_q), 1)[0]
    ops = jax.jit(new.prepare)(*args)
    cluster = new.cluster_size(ops[0].shape[1])
    fns = {name: jax.jit(functools.partial(m.context_attention, num_q=num_q, scale=576 ** -0.5, v_dim=512,
                                           cluster=cluster, splits=splits)) for name, m in (("old", old), ("new", new))}
    outs = {k: jax.block_until_ready(f(*ops)) for k, f in fns.items()}
    same = all(bool(jnp.array_equal(a, b, equal_nan=True)) for a, b in zip(outs["old"], outs["new"]))
    t = {"old": [], "new": []}
    for _ in range(4):
        for k, f in fns.items():
            t[k].append(bench_util.traced_device_time(f, *ops, calls=40)["top"][0]["us"])
    row = dict(ctx=ctx, q=num_q, s=num_s, splits=splits, identical=same, old=t["old"], new=t["new"],
               old_med=float(np.median(t["old"])), new_med=float(np.median(t["new"])))
    rows.append(row)
    print(json.dumps(row), flush=True)
print("| ctx | Q | S | runs | identical | old us | new us |")
for r in rows:
    print(f"| {r['ctx']} | {r['q']} | {r['s']} | {r['splits']} | {r['identical']} | {r['old_med']:.2f} | {r['new_med']:.2f} |")
