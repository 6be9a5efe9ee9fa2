"""zp_mma gate_up on the GPU at K2's K: per-row error of h against float64, by route and K."""
import numpy as np, jax, jax.numpy as jnp, sys
from pallas_kernels import moe
from pallas_kernels.moe import pallas_triton as pt, tuning, int4
from pallas_kernels.moe.reference import dequantize_int4_golden
e, i, k, t = 16, 2048, 8, 16
for d in (288, 2048, 7168):
    keys = jax.random.split(jax.random.key(1), 8)
    experts = {}
    for j, (name, kk, n) in enumerate((("gate", int4.padded_k(d), i), ("up", int4.padded_k(d), i), ("down", int4.padded_k(i), d))):
        experts[f"{name}_qweight"] = jax.lax.bitcast_convert_type(jax.random.bits(keys[2*j], (e, kk//8, n), jnp.uint32), jnp.int32)
        experts[f"{name}_qscale"] = jax.random.uniform(keys[2*j+1], (e, kk//32, n), minval=0.004, maxval=0.01).astype(jnp.bfloat16).astype(jnp.float16)
    hf = moe.experts_to_hf(experts)
    gw = {n: dequantize_int4_golden(np.asarray(hf[f"{n}_packed"]), np.asarray(hf[f"{n}_scale"], np.float64)) for n in ("gate", "up")}
    rng = np.random.default_rng(0)
    ids = np.stack([rng.choice(e, k, replace=False) for _ in range(t)]).astype(np.int32)
    w = rng.random((t, k)).astype(np.float32)
    x = jax.random.normal(keys[7], (t, d), jnp.bfloat16)
    xf = np.asarray(x.astype(jnp.float32), np.float64)
    dm = moe.dims(experts)
    flat = ids.reshape(-1)
    gx = np.einsum("sid,sd->si", gw["gate"][flat], xf[np.arange(t * k) // k])
    ux = np.einsum("sid,sd->si", gw["up"][flat], xf[np.arange(t * k) // k])
    for name, cfg in [("f16 asm", tuning.config(t)), ("zp asm", tuning.config(t)._replace(zp_mma_gate_up=True)),
                      ("zp bits", tuning.config(t)._replace(zp_mma_gate_up=True, dequant="bits")),
                      ("f16 bits", tuning.config(t)._replace(dequant="bits"))]:
        r, row_token, row_weight = pt.routed_rows(jnp.asarray(ids), jnp.asarray(w), e, cfg.bm)
        real = row_token >= 0
        if cfg.zp_mma_gate_up:
            x16, cx, rs = pt.to_f16_nozp(x)
        else:
            (x16, cx), rs = pt.to_f16_rows(x), None
        rowscale = jnp.where(real, cx[jnp.maximum(row_token, 0)], 1.0)
        # g alone: h = silu(g) * u; compare h
        h = pt.gate_up(x16, row_token, r.block_expert, experts, dm, cfg, row_scale=rowscale, rs=rs)
        h = np.asarray(h, np.float64)[np.asarray(r.slot_row)]
        href = gx / (1 + np.exp(-gx)) * ux
        err = np.linalg.norm(h - href, axis=1) / np.linalg.norm(href, axis=1)
        ecol = np.abs(h - href).reshape(t * k, -1, 64).max(axis=(0, 2)) / np.abs(href).max()
        print(f"d={d} {name:9s} h rel err rows: max {err.max():.2e} median {np.median(err):.2e}; worst col tiles "
              + " ".join(f"{c}:{ecol[c]:.1e}" for c in np.argsort(ecol)[-4:]), flush=True)
