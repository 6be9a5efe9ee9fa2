"""Session-16 probe (kept as run; BENCHMARKS.md issue 7, "Session 16"), on the H200:
`OUT=. PYTHONPATH=. python3 experiments/results/kernels_h200_session16.py` (the HLO files it writes were not kept).
 (1) every kernel of a 1-stream ddtree@64 and ar step (name, scope, count, us
per step) and the compiled step's HLO; (2) the shipped target's MLA call alone at the verify shapes
(S 1, H 4, latent 64 + rope 16, heads first, rope apart), device time per call by config."""
import functools, json, os, tempfile
import jax, jax.numpy as jnp, numpy as np
import ddtree_jax as dj
from ddtree_jax import bench_util, data, engine
from pallas_kernels.mla_attention import pallas_triton as mp
out = os.environ["OUT"]
target = dj.load_target("assets/pair/target", dtype=jnp.bfloat16)
drafter = dj.load_drafter("assets/pair/drafter", dtype=jnp.bfloat16)
prompts = data.load_prompts("assets/pair/heldout_prompts.json")
res = {"steps": {}, "mla": []}
for method in ("ddtree", "ar"):
    su = engine.setup(target, drafter, [prompts[0]], method=method, budget=64, max_new_tokens=128)
    dp = drafter[1] if method != "ar" else None
    st = engine.prefill(target, drafter, su)
    step = engine.decode_steps.lower(target[1], dp, st, su.plan, 1).compile()
    hlo = step.as_text()
    open(os.path.join(out, f"step_{method}.hlo.txt"), "w").write(hlo)
    scopes = bench_util.hlo_kernel_scopes(hlo)
    for _ in range(3):
        st, _l = step(target[1], dp, st)
    jax.block_until_ready(st)
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            for _ in range(10):
                st, _l = step(target[1], dp, st)
            jax.block_until_ready(st)
        ks, _ = bench_util.device_kernels(d)
    agg = {}
    for k in ks:
        a = agg.setdefault(k["name"], [0, 0.0])
        a[0] += 1; a[1] += k["dur"]
    rows = sorted(({"name": n, "scope": scopes.get(n, "?"), "per_step": c / 10, "us": t / 10}
                   for n, (c, t) in agg.items()), key=lambda r: -r["us"])
    res["steps"][method] = rows
    print(method, "kernels/step", sum(r["per_step"] for r in rows), "us", round(sum(r["us"] for r in rows), 1), flush=True)
# MLA at the shipped shapes
key = jax.random.PRNGKey(0)
for q in (1, 65, 97, 129):
    for ctx in (200, 330):
        slots = 420
        ks = jax.random.split(key, 4)
        qlat = jax.random.normal(ks[0], (1, 4, q, 64), jnp.bfloat16)
        qpe = jax.random.normal(ks[1], (1, 4, q, 16), jnp.bfloat16)
        kv = jax.random.normal(ks[2], (1, slots, 80), jnp.bfloat16)
        vis = jnp.tril(jnp.ones((1, q, q), bool))
        from pallas_kernels.mla_attention import visibility_to_mask
        nm = visibility_to_mask(vis)
        lens = jnp.array([ctx], jnp.int32)
        cfgs = ["32x64x4x2", "16x64x4x2", "64x64x4x2", "32x32x4x2", "32x128x4x2", "16x32x4x2",
                "32x64x4x1", "16x64x2x2", "32x64x4x2s2", "16x64x4x2s2", "32x64x4x2s4"]
        ref = None
        for c in cfgs:
            cfg = mp.BlockConfig.parse(c)
            fn = jax.jit(functools.partial(mp.mla_attention_pallas, scale=0.1, v_dim=64, config=cfg,
                                           heads_first=True))
            o = jax.block_until_ready(fn(qlat, kv, lens, nm, q_rope=qpe))
            ref = o if ref is None else ref
            err = float(jnp.max(jnp.abs(o.astype(jnp.float32) - ref.astype(jnp.float32))))
            t = bench_util.traced_device_time(lambda: fn(qlat, kv, lens, nm, q_rope=qpe), calls=20)
            r = dict(q=q, ctx=ctx, config=c, busy_us=t["busy_us"] if t else None, kernels=t["kernels"] if t else None, top=t["top"][:3] if t else None, err=err)
            res["mla"].append(r)
            print(r, flush=True)
json.dump(res, open(os.path.join(out, "kernels_probe.json"), "w"), indent=1)
