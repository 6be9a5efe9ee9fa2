"""Session-13 probe, kept as run on the H200 (`OUT=. PYTHONPATH=. python3 experiments/results/topk_small_vocab_h200_session13.py` -> topk13.json, saved as topk_small_vocab_h200_session13.json): the top-K of the draft logits at the shipped pair's vocabulary (V = 2048,
K = 64, float32) under SelectConfig variants; device time per call (profiler) and exactness
against jax.lax.top_k."""
import json, os
import jax, jax.numpy as jnp, numpy as np
from ddtree_jax import bench_util
from pallas_kernels.topk import pallas_triton as tp

rows = []
variants = {"default": tp.SelectConfig(), "gcap1": tp.SelectConfig(group_cap=1),
            "ecap2": tp.SelectConfig(elem_cap=2), "gcap1_ecap2": tp.SelectConfig(group_cap=1, elem_cap=2),
            "g8_gcap1": tp.SelectConfig(group=8, group_cap=1), "g4_gcap1": tp.SelectConfig(group=4, group_cap=1),
            "g16_gcap1_w4": tp.SelectConfig(group_cap=1, warps=4), "default_w4": tp.SelectConfig(warps=4),
            "default_w8": tp.SelectConfig(warps=8)}
for R in (15, 60, 240):
    rng = np.random.default_rng(R)
    x = jnp.asarray(rng.standard_normal((R, 2048)) * 3, jnp.float32)
    wv, wi = jax.lax.top_k(x, 64)
    lse = jax.nn.logsumexp(x, axis=1)
    r = dict(R=R)
    f = jax.jit(lambda x: jax.lax.top_k(x, 64))
    r["lax_top_k_us"] = bench_util.traced_device_time(f, x, calls=30)["busy_us"]
    for name, cfg in variants.items():
        f = jax.jit(lambda x, cfg=cfg: tp._topk(x, 64, True, cfg))
        v, i, l = f(x)
        ok = bool(np.array_equal(np.asarray(v), np.asarray(wv)) and np.array_equal(np.asarray(i), np.asarray(wi))
                  and np.allclose(np.asarray(l), np.asarray(lse), rtol=1e-6, atol=1e-5))
        t = bench_util.traced_device_time(f, x, calls=30)
        r[name + "_us"] = round(t["busy_us"], 2)
        r[name + "_ok"] = ok
    rows.append(r)
    print(r, flush=True)
json.dump(rows, open(os.environ["OUT"] + "/topk13.json", "w"), indent=1)
print(bench_util.markdown_table(rows, [c for c in rows[0] if not c.endswith("_ok")]))
print("all exact:", all(v for r in rows for k, v in r.items() if k.endswith("_ok")))
