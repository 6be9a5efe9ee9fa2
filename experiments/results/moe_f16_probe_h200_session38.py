"""Probe (session 38; run before the row scaling existed, so float16 activations went straight into
the kernels: today the same call takes pallas_triton.f16_compute's scaled path): INT4 MoE with float16 activations and scales (odd nibble planes need no shift)
against the tuned bf16 path, K2 layer shape. Correctness vs an f32 xla reference first, then
traced device time, alternating rounds."""
import sys, json
import numpy as np
import jax, jax.numpy as jnp
from ddtree_jax import bench_util
from pallas_kernels.moe import int4
from pallas_kernels.moe.pallas_triton import moe_experts_pallas
from pallas_kernels.moe.xla import moe_experts_xla

e, d, i, k = 384, 7168, 2048, 8
keys = jax.random.split(jax.random.key(1), 8)
ex = {}
for j, (name, kk, n) in enumerate((("gate", int4.padded_k(d), i), ("up", int4.padded_k(d), i), ("down", int4.padded_k(i), d))):
    ex[f"{name}_qweight"] = jax.lax.bitcast_convert_type(jax.random.bits(keys[2 * j], (e, kk // 8, n), jnp.uint32), jnp.int32)
    ex[f"{name}_qscale"] = jax.random.uniform(keys[2 * j + 1], (e, kk // 32, n), minval=0.004, maxval=0.01).astype(jnp.bfloat16)
ex16 = {kk: (v.astype(jnp.float16) if kk.endswith("qscale") else v) for kk, v in ex.items()}
res = []
for t in map(int, sys.argv[1].split(",")):
    kid, kw, kx = jax.random.split(jax.random.fold_in(keys[7], t), 3)
    ids = jnp.argsort(jax.random.uniform(kid, (t, e)), axis=-1)[:, :k].astype(jnp.int32)
    w = jax.random.uniform(kw, (t, k), minval=0.1, maxval=1.0)
    w = (w / w.sum(-1, keepdims=True)).astype(jnp.float32)
    x = jax.random.normal(kx, (t, d), jnp.bfloat16)
    ref = np.asarray(jax.jit(moe_experts_xla)(x.astype(jnp.float32), ids, w, ex), np.float64)
    fns = {"bf16": (jax.jit(moe_experts_pallas), (x, ids, w, ex)),
           "f16": (jax.jit(moe_experts_pallas), (x.astype(jnp.float16), ids, w, ex16))}
    row = {"T": t}
    for name, (fn, args) in fns.items():
        out = np.asarray(fn(*args).astype(jnp.float32), np.float64)
        row[f"err_{name}"] = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
    for rnd in range(3):
        for name, (fn, args) in fns.items():
            tr = bench_util.traced_device_time(fn, *args, calls=20)
            row.setdefault(name, []).append(tr["busy_us"])
            row.setdefault(f"{name}_top", tr["top"])
    res.append(row)
    print(json.dumps({kk: v for kk, v in row.items() if not kk.endswith("_top")}), flush=True)
print("| T | rel err bf16 | rel err f16 | bf16 device us (3 rounds) | f16 device us | f16 / bf16 (medians) |")
for r in res:
    print(f"| {r['T']} | {r['err_bf16']:.2e} | {r['err_f16']:.2e} | {', '.join(f'{v:.0f}' for v in r['bf16'])} | "
          f"{', '.join(f'{v:.0f}' for v in r['f16'])} | {np.median(r['f16']) / np.median(r['bf16']):.3f} |")
json.dump(res, open(sys.argv[2], "w"), indent=1, default=str)
