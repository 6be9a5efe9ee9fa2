"""Why MoE configs with 64- or 128-row blocks failed the golden check on the H200 (session 49).

kernel_bench's variants bm=64 (4 or 8 warps) and bm=128, Pallas and raw Triton, all gave the same
wrong output at T = 2048 / 4096 (rel err 0.796 / 1.176), while the CPU interpreter passes them.
This runs each stage alone into NaN-poisoned outputs and compares it with the tuned config's
stage, per slot: which slots are wrong or unwritten, by the body size of their row block.
  python3 experiments/results/moe_bm64_diag_session49/diag.py [T,T..] [budget_s]
Run at 77dd7f5 (diag_t2048.log). Since 255d816 MoEConfig.check refuses dequant='asm' with bm >= 64,
so those rows now record that ValueError; `git checkout 77dd7f5 -- pallas_kernels` reproduces.
"""
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.moe import int4, tuning
from pallas_kernels.moe import pallas_triton as pt
from pallas_kernels.moe.align import align_routing
from pallas_kernels.moe.experts import dims

GPU = jax.default_backend() == "gpu"
E, D, I, K = (384, 7168, 2048, 8) if GPU else (16, 512, 256, 4)
TS = [int(t) for t in (sys.argv[1] if len(sys.argv) > 1 else "2048,256,64").split(",")]
BUDGET = float(sys.argv[2]) if len(sys.argv) > 2 else 1e9
keys = jax.random.split(jax.random.key(1), 8)
experts = {}
for j, (name, kk, n) in enumerate((("gate", int4.padded_k(D), I), ("up", int4.padded_k(D), I),
                                   ("down", int4.padded_k(I), D))):
    experts[f"{name}_qweight"] = jax.lax.bitcast_convert_type(
        jax.random.bits(keys[2 * j], (E, kk // 8, n), jnp.uint32), jnp.int32)
    experts[f"{name}_qscale"] = jax.random.uniform(keys[2 * j + 1], (E, kk // 32, n), minval=0.004,
                                                   maxval=0.01).astype(jnp.bfloat16)
dm = dims(experts)
mods = {"pallas": pt}
if GPU:
    from pallas_kernels.moe import triton_impl
    mods["raw"] = triton_impl


def body_sizes(row_slot, bm, min_bm, n):
    """Per slot: the body size (rows multiplied) of its row block, host side."""
    rs = np.asarray(row_slot)
    out = np.zeros(n, np.int32)
    for b in range(rs.size // bm):
        blk = rs[b * bm:(b + 1) * bm]
        real = blk[blk < n]
        if real.size == 0:
            continue
        m, size = bm, bm // 2
        while min_bm and size >= min_bm:
            if blk[size] >= n:
                m = size
            size //= 2
        out[real] = m
    return out


def stages(mod, cfg, x, ids, w, h_in):
    @jax.jit
    def run(x, ids, w, h_in, experts):     # experts an argument: closed over, jit embeds 8 GB of constants
        r = align_routing(ids, E, cfg.bm)
        h = mod.gate_up(x, r.row_slot, r.block_expert, experts, dm, cfg, K,
                        out=jnp.full((x.shape[0] * K, I), jnp.nan, x.dtype))
        y = mod.down(h_in, r.row_slot, w.reshape(-1), r.block_expert, experts, dm, cfg,
                     out=jnp.full((x.shape[0] * K, D), jnp.nan, jnp.float32))
        return h, y, r.row_slot
    return run(x, ids, w, h_in, experts)


def compare(got, ref):
    g, r = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    nan = ~np.isfinite(g).all(axis=1)
    err = np.linalg.norm(np.nan_to_num(g) - r, axis=1) / np.maximum(np.linalg.norm(r, axis=1), 1e-30)
    return nan, err


t0 = time.time()
results = []
for t in TS:
    kx, kr, kw = jax.random.split(jax.random.fold_in(keys[7], t), 3)
    x = jax.random.normal(kx, (t, D), jnp.bfloat16)
    ids = jnp.argsort(jax.random.uniform(kr, (t, E)), axis=1)[:, :K].astype(jnp.int32)
    w = jax.random.uniform(kw, (t, K), jnp.float32)
    tuned = tuning.config(t)
    h_ref, y_ref, _ = stages(pt, tuned, x, ids, w, jnp.zeros((t * K, I), jnp.bfloat16))
    h_ref = h_ref.astype(jnp.bfloat16)
    _, y_ref, _ = stages(pt, tuned, x, ids, w, h_ref)
    cfgs = [tuned._replace(bm=64), tuned._replace(bm=64, min_bm=0),
            tuned._replace(bm=64, min_bm=0, scale_weights=False), tuned._replace(bm=64, dequant="bits"),
            tuned._replace(bm=64, num_warps=8), tuned._replace(bm=128, num_stages=2),
            tuned._replace(bm=32, min_bm=0)]
    for name, mod in mods.items():
        for cfg in ([tuned] if name == "raw" else []) + cfgs:
            if time.time() - t0 > BUDGET:
                print("budget: stop", flush=True)
                break
            row = {"T": t, "impl": name, "cfg": str(tuple(cfg))}
            try:
                h, y, row_slot = stages(mod, cfg, x, ids, w, h_ref)
                sizes = body_sizes(row_slot, cfg.bm, cfg.min_bm, t * K)
                for stage, got, ref in (("gate_up", h, h_ref), ("down", y, y_ref)):
                    nan, err = compare(got, ref)
                    bad = nan | (err > 2e-2)
                    row[stage] = {"nan_rows": int(nan.sum()), "bad_rows": int(bad.sum()),
                                  "median_err": float(np.median(err[~nan])) if (~nan).any() else None,
                                  "bad_by_body": {int(m): [int((bad & (sizes == m)).sum()), int((sizes == m).sum())]
                                                  for m in np.unique(sizes)}}
            except Exception as exc:  # noqa: BLE001 - record and go on
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            results.append(row)
            print(json.dumps(row), flush=True)
print(f"done in {time.time() - t0:.0f} s")
