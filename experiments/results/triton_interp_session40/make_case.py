"""Build one raw-Triton MoE case with the repo's code (jax venv): experts in kernel layout, routing
alignment, float64 goldens of h and y in slot layout. Saves an npz for run_interp.py."""
import sys
import jax, jax.numpy as jnp, numpy as np
from pallas_kernels import moe
from pallas_kernels.moe.align import align_routing
from pallas_kernels.moe.reference import dequantize_int4_golden

def build(path, seed, counts, d, i, bm, min_bm, act_dtype, scale_dtype):
    rng = np.random.default_rng(seed)
    e = len(counts)
    hf = [moe.quantize_int4(rng.standard_normal(s).astype(np.float32) * 0.5) for s in ((e, i, d), (e, i, d), (e, d, i))]
    ex = moe.prepare_experts_int4(*hf[0], *hf[1], *hf[2], scale_dtype=scale_dtype)
    g, u, dn = (dequantize_int4_golden(p, s) for p, s in hf)
    ids = rng.permutation(np.repeat(np.arange(e), counts)).astype(np.int32)[:, None]
    t = ids.shape[0]
    w = rng.random(ids.shape).astype(np.float32)
    x = jnp.asarray(rng.standard_normal((t, d)) * 0.5, act_dtype)
    r = align_routing(jnp.asarray(ids), e, bm)
    xf = np.asarray(x.astype(jnp.float32), np.float64)
    flat = ids.reshape(-1)
    gx = np.einsum("sid,sd->si", g[flat], xf)
    ux = np.einsum("sid,sd->si", u[flat], xf)
    h = gx / (1 + np.exp(-gx)) * ux
    y = w.reshape(-1, 1) * np.einsum("sdi,si->sd", dn[flat], h)
    arrs = {k: np.asarray(v.view(jnp.uint16) if v.dtype in (jnp.bfloat16, jnp.float16) else v) for k, v in ex.items()}
    np.savez(path, x=np.asarray(x.view(jnp.uint16)) if x.dtype != jnp.float32 else np.asarray(x), w=w.reshape(-1),
             row_slot=np.asarray(r.row_slot), block_expert=np.asarray(r.block_expert), h=h, y=y,
             bm=bm, min_bm=min_bm, d=d, i=i, top_k=1, act=str(jnp.dtype(act_dtype)), scale=str(jnp.dtype(scale_dtype)), **arrs)

build("/tmp/interp/case_f16.npz", 1, [5, 16, 17, 33, 64, 70], 288, 64, 64, 16, jnp.float16, jnp.float16)
build("/tmp/interp/case_f16_bm16.npz", 2, [1, 3, 0, 7, 2], 288, 96, 16, 0, jnp.float16, jnp.float16)
build("/tmp/interp/case_f32.npz", 3, [5, 16, 17, 33], 96, 64, 32, 16, jnp.float32, jnp.bfloat16)
print("ok")
