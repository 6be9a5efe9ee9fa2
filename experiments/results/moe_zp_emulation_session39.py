"""Session 39 (branch wip/zp-mma): emulate the zero-point-free float16 weights (n*s rounded, minus 8 s) at kernel_bench's K2 inputs in float64; output error of that rounding alone. CPU; ~10 GB of memory."""
import numpy as np, jax, jax.numpy as jnp, sys
sys.path.insert(0, "experiments")
from kernel_bench import _routings
from pallas_kernels.moe import int4
e, d, i, k = 384, 7168, 2048, 8
keys = jax.random.split(jax.random.key(1), 8)
need = np.arange(16) * 7 % e
W = {}
for j, (name, kk, n) in enumerate((("gate", d, i), ("up", d, i), ("down", i, d))):
    q = jax.lax.bitcast_convert_type(jax.random.bits(keys[2*j], (e, kk//8, n), jnp.uint32), jnp.int32)[need]
    s = jax.random.uniform(keys[2*j+1], (e, kk//32, n), minval=0.004, maxval=0.01).astype(jnp.bfloat16).astype(jnp.float16)[need]
    # nibbles [E, K, N] in kernel layout order
    qq = np.asarray(q).view(np.uint32)
    nib = np.stack([(qq >> (4*jj)) & 0xF for jj in range(8)], axis=2)  # [E, Kp/8, 8, N]: word row r of kb, plane j
    E_, W8, _, N = nib.shape
    nib = nib.reshape(E_, kk//256, 32, 8, N).transpose(0, 1, 3, 2, 4).reshape(E_, kk, N).astype(np.float64)
    sc = np.repeat(np.asarray(s, np.float64), 32, axis=1)
    exact = ((nib - 8) * sc).astype(np.float32)
    zp = ((nib * sc).astype(np.float16).astype(np.float64) - 8 * sc).astype(np.float32); del nib, sc, qq
    W[name] = (exact, zp)
    print(name, "weights max |zp-exact|/max|exact|", np.abs(zp-exact).max()/np.abs(exact).max(), flush=True)
pos = {int(x): jj for jj, x in enumerate(need)}
for t in (1, 16, 64, 256):
    key = jax.random.fold_in(keys[7], t)
    ids, w, _ = _routings(key, t, e, k, 4)
    ids, w = np.asarray(ids[0][:2]), np.asarray(w[0][:2], np.float64); m = ids.shape[0]
    x = np.asarray(jax.random.normal(jax.random.fold_in(key, 0), (t, d), jnp.bfloat16)[:2].astype(jnp.float32), np.float64)
    ys = {}
    for mode in ("exact", "gate_up zp", "both zp"):
        y = np.zeros((m, d))
        for r in range(m):
            for sl in range(k):
                ei = pos[int(ids[r, sl])]
                gsel = 1 if mode != "exact" else 0
                g = x[r] @ W["gate"][gsel][ei].astype(np.float64); u = x[r] @ W["up"][gsel][ei].astype(np.float64)
                h = g / (1 + np.exp(-g)) * u
                dsel = 1 if mode == "both zp" else 0
                y[r] += w[r, sl] * (h @ W["down"][dsel][ei].astype(np.float64))
        ys[mode] = y
    ref = ys["exact"]
    for mode in ("gate_up zp", "both zp"):
        print(t, mode, "rel err %.2e" % (np.linalg.norm(ys[mode]-ref)/np.linalg.norm(ref)), flush=True)
