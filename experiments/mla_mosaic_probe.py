"""The Mosaic GPU MLA kernel alone: its producer's trip count read at run time against static.

For each (ctx, Q, S) with every stream at ctx (ctx // 128 whole key pairs, no tree tail), times
`mosaic_gpu.context_attention` in both producer forms, after checking each against its XLA twin
on stream 0 (relative error of O, absolute error of lse). FLOPs = 2 S R 128 pairs (Dk + v_dim),
bytes = the latent cache read once + queries + outputs; floor = max(bytes / copy bandwidth, FLOPs /
matmul rate) from ceilings measured in the same run. Shares mla_bench's --heads, --dk, --v_dim, --out. --dump_dir makes Mosaic GPU write each
kernel's PTX, ptxas report and SASS there (the variables MOSAIC_GPU_DUMP_*). Off the GPU,
--lower_only lowers both forms for CUDA and stops (the CPU test of this script).

  export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
  python3 experiments/mla_mosaic_probe.py --out=$OUT/probe.json
  python3 experiments/mla_mosaic_probe.py --shapes=8192:16:16 --dump_dir=$OUT/dump
"""

from __future__ import annotations

import functools
import json
import os

from absl import app, flags

from experiments.mla_bench import measure_ceilings, time_jax   # also defines --heads, --dk, --v_dim, --out

FLAGS = flags.FLAGS
flags.DEFINE_list("shapes", ["8192:16:16", "8192:64:16", "8192:256:16", "32768:64:8"], "ctx:Q:S triples")
flags.DEFINE_string("dump_dir", "", "if set, Mosaic GPU dumps PTX, ptxas output and SASS here")
flags.DEFINE_bool("lower_only", False, "lower both forms for CUDA and stop (runs on a CPU)")

_TOL = 1e-2         # bf16 O against the float32 twin


def main(_):
    if FLAGS.dump_dir:      # read by the compiler at compile time: set before anything compiles
        os.makedirs(FLAGS.dump_dir, exist_ok=True)
        os.environ.update(MOSAIC_GPU_DUMP_PTX="1", MOSAIC_GPU_DUMP_PTXAS="1", MOSAIC_GPU_DUMP_SASS="1",
                          MOSAIC_GPU_DUMP_TO=FLAGS.dump_dir)
    import jax
    import jax.numpy as jnp
    import numpy as np

    from pallas_kernels.mla_attention import mosaic_gpu

    heads, dk, v_dim = FLAGS.heads, FLAGS.dk, FLAGS.v_dim
    scale = dk ** -0.5
    ceilings = None if FLAGS.lower_only else measure_ceilings()
    if ceilings:
        print(f"ceilings {json.dumps(ceilings)}  device {jax.devices()[0].device_kind}  jax {jax.__version__}")
    rows = []
    for shape in FLAGS.shapes:
        ctx, num_q, num_s = map(int, shape.split(":"))
        r, pairs_n = num_q * heads, ctx // mosaic_gpu.PAIR
        pairs = jnp.full((num_s,), pairs_n, jnp.int32)
        cluster = mosaic_gpu.cluster_size(r)
        forms = {"runtime": None, "static": pairs_n}
        if FLAGS.lower_only:
            specs = (jax.ShapeDtypeStruct((num_s, r, dk), jnp.bfloat16),
                     jax.ShapeDtypeStruct((num_s, ctx + 8, dk), jnp.bfloat16))
            for name, sp in forms.items():
                fn = jax.jit(lambda q, kv, sp=sp: mosaic_gpu.context_attention(
                    q, kv, pairs, scale=scale, v_dim=v_dim, cluster=cluster, static_pairs=sp))
                fn.trace(*specs).lower(lowering_platforms=("cuda",))
                print(f"ctx={ctx} Q={num_q} S={num_s} {name}: lowered")
            continue
        kq, kk = jax.random.split(jax.random.key(ctx + num_q + num_s))
        q = jax.random.normal(kq, (num_s, r, dk), jnp.bfloat16)
        kv = jax.random.normal(kk, (num_s, ctx + 8, dk), jnp.bfloat16)
        o_ref, lse_ref = mosaic_gpu.context_attention_xla(q[:1].astype(jnp.float32), kv[:1].astype(jnp.float32),
                                                          pairs[:1], scale=scale, v_dim=v_dim)
        o_ref, lse_ref = np.asarray(o_ref, np.float64), np.asarray(lse_ref, np.float64)
        flops = 2 * num_s * r * pairs_n * mosaic_gpu.PAIR * (dk + v_dim)
        nbytes = 2 * num_s * (ctx * dk + r * (dk + v_dim))
        floor = max(nbytes / (ceilings["copy_tbps"] * 1e12),
                    flops / (max(ceilings["matmul_tflops_xla"], ceilings["matmul_tflops_torch"]) * 1e12))
        for name, sp in forms.items():
            fn = jax.jit(functools.partial(mosaic_gpu.context_attention, scale=scale, v_dim=v_dim,
                                           cluster=cluster, static_pairs=sp))
            row = dict(ctx=ctx, q=num_q, s=num_s, form=name, cluster=cluster, flops=flops, bytes=nbytes,
                       floor_ms=floor * 1e3)
            try:
                o, lse = fn(q, kv, pairs)
                o0 = np.asarray(o[0], np.float64)
                row["rel_err"] = float(np.linalg.norm(o0 - o_ref[0]) / np.linalg.norm(o_ref[0]))
                row["lse_err"] = float(np.max(np.abs(np.asarray(lse[0], np.float64) - lse_ref[0])))
                if not row["rel_err"] <= _TOL:
                    raise AssertionError(f"wrong output: rel err {row['rel_err']:.1e}")
                sec = time_jax(fn, [(q, kv, pairs)])
                row.update(ms=sec * 1e3, tflops=flops / sec / 1e12, pct_floor=100 * floor / sec)
            except Exception as e:  # report and go on
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
            rows.append(row)
            print(json.dumps(row), flush=True)
    if FLAGS.lower_only:
        print("ok")
        return
    if FLAGS.out:
        with open(FLAGS.out, "w") as f:
            json.dump({"ceilings": ceilings, "rows": rows, "device": jax.devices()[0].device_kind,
                       "jax": jax.__version__}, f, indent=1)
    print("| ctx | Q | S | cluster | floor ms | run-time count ms (% floor) | static count ms (% floor) | static speedup |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for shape in sorted({(r["ctx"], r["q"], r["s"]) for r in rows}):
        by = {r["form"]: r for r in rows if (r["ctx"], r["q"], r["s"]) == shape}
        cell = lambda r: f"{r['ms']:.3f} ({r['pct_floor']:.1f})" if "ms" in r else "error"
        gain = (f"{by['runtime']['ms'] / by['static']['ms']:.2f}x"
                if "ms" in by["runtime"] and "ms" in by["static"] else "-")
        print(f"| {shape[0]} | {shape[1]} | {shape[2]} | {by['runtime']['cluster']} | "
              f"{by['runtime']['floor_ms']:.3f} | {cell(by['runtime'])} | {cell(by['static'])} | {gain} |")


if __name__ == "__main__":
    app.run(main)
