"""Session-12 probe, kept as run on the H200 at 386af4b (BENCHMARKS.md "Session 12"): `OUT=.
PYTHONPATH=. python3 experiments/results/kernels_h200_session12.py` -> kernels.json (saved as
kernels_h200_session12.json) and the compiled step's HLO (not kept).
Every kernel of a ddtree@64 step at 1 and 16 streams (H200): name, scope, count and us per step; the GPU HLO."""
import json, os, tempfile
import jax, jax.numpy as jnp, numpy as np
import ddtree_jax as dj
from ddtree_jax import bench_util, data, engine
out = os.environ["OUT"]
target = dj.load_target("assets/pair/target", dtype=jnp.bfloat16)
drafter = dj.load_drafter("assets/pair/drafter", dtype=jnp.bfloat16)
prompts = data.load_prompts("assets/pair/heldout_prompts.json")
res = {}
for s in (1, 16):
    su = engine.setup(target, drafter, prompts[:s] if s <= 20 else prompts, method="ddtree", budget=64, max_new_tokens=20 * 17 + 8)
    st = engine.prefill(target, drafter, su)
    step = engine.decode_steps.lower(target[1], drafter[1], st, su.plan, 1).compile()
    hlo = step.as_text()
    open(os.path.join(out, f"step_S{s}.hlo.txt"), "w").write(hlo)
    scopes = bench_util.hlo_kernel_scopes(hlo)
    for _ in range(3):
        st, _l = step(target[1], drafter[1], st)
    jax.block_until_ready(st)
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            for _ in range(20):
                st, _l = step(target[1], drafter[1], st)
            jax.block_until_ready(st)
        ks, _ = bench_util.device_kernels(d)
    agg = {}
    for k in ks:
        a = agg.setdefault(k["name"], [0, 0.0])
        a[0] += 1; a[1] += k["dur"]
    rows = sorted(({"name": n, "scope": scopes.get(n, "?"), "per_step": c / 20, "us": t / 20} for n, (c, t) in agg.items()), key=lambda r: -r["us"])
    res[s] = rows
    print(s, "kernels/step", sum(r["per_step"] for r in rows), "us", round(sum(r["us"] for r in rows), 1))
    for r in rows:
        if "draft" not in r["scope"] and "verify" not in r["scope"] and "tree" not in r["scope"] or r["scope"] == "?":
            print("  ", r["name"][:60], r["scope"][:80], r["per_step"], round(r["us"], 2))
json.dump(res, open(os.path.join(out, "kernels.json"), "w"), indent=1)
