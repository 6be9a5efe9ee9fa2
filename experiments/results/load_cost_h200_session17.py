"""Session-17 probe: what CompiledDecode.load costs (host and wall), against jnp.copy of the state,
and the decode's host call time and wall from a loaded vs a copied state (ddtree@64 k=2 device
loop, prompt 0, 128 new tokens).
Run at 079159e. Its decode rows alternate loaded and copied states, so every decode moved the
addresses again (both rows re-record): only the load/copy rows are meaningful. Kept as run;
BENCHMARKS.md issue 7, "Session 17".
"""
import functools, json, os, time
import jax, jax.numpy as jnp, numpy as np
import ddtree_jax as dj
from ddtree_jax import data, engine
out = os.environ.get("OUT", ".")
target = dj.load_target("assets/pair/target", dtype=jnp.bfloat16)
drafter = dj.load_drafter("assets/pair/drafter", dtype=jnp.bfloat16)
prompts = data.load_prompts("assets/pair/heldout_prompts.json")
tp, dp = target[1], drafter[1]
copy = functools.partial(jax.tree_util.tree_map, jnp.copy)
su = engine.setup(target, drafter, [prompts[0]], method="ddtree", budget=64, max_new_tokens=128)
pre = jax.block_until_ready(engine.prefill(target, drafter, su))
call = engine.compile_decode(tp, dp, pre, su, 2, "device")
jax.block_until_ready(call(tp, dp, copy(pre)))
R = {k: [] for k in ("load host", "load wall", "copy host", "copy wall", "decode host (loaded)",
                     "decode wall (loaded)", "decode host (copied)", "decode wall (copied)")}
for rep in range(15):
    for kind, fn in (("load", call.load), ("copy", copy)):
        t0 = time.perf_counter(); st = fn(pre); t1 = time.perf_counter(); jax.block_until_ready(st); t2 = time.perf_counter()
        R[f"{kind} host"].append(t1 - t0); R[f"{kind} wall"].append(t2 - t0)
        name = "loaded" if kind == "load" else "copied"
        t0 = time.perf_counter(); fin = call(tp, dp, st); t1 = time.perf_counter(); fin.out_len.block_until_ready(); t2 = time.perf_counter()
        R[f"decode host ({name})"].append(t1 - t0); R[f"decode wall ({name})"].append(t2 - t0)
med = {k: 1e3 * float(np.median(v)) for k, v in R.items()}
for k, v in med.items():
    print(f"| {k} | {v:.3f} ms |")
json.dump(dict(median_ms=med, raw_ms={k: [1e3 * t for t in v] for k, v in R.items()}, date=time.strftime("%Y-%m-%d"),
               jax=jax.__version__), open(os.path.join(out, "load_cost.json"), "w"), indent=1)
