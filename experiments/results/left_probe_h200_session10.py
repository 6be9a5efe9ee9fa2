"""Session-10 probe, kept as it ran on the H200 (results: left_probe_h200_session10.json; run from
the repo root with PYTHONPATH=.). Does the step's fresh `left` output cost host dispatch (CUDA-graph updates)?
A: engine.decode_steps (state, left). B: a step returning only the donated state (every output aliased)
plus a separate tiny jitted tokens_left(state). Same decode loop (engine.decode, paced, lag 1)."""
import functools, json, os, sys, time
import jax, jax.numpy as jnp, numpy as np
import ddtree_jax as dj
from ddtree_jax import data, engine

dtype = jnp.dtype(sys.argv[1]) if len(sys.argv) > 1 else jnp.bfloat16
n_prompts = int(sys.argv[2]) if len(sys.argv) > 2 else 20
max_new = int(sys.argv[3]) if len(sys.argv) > 3 else 128
reps = int(sys.argv[4]) if len(sys.argv) > 4 else 5
k, budget = 4, 64
target = dj.load_target("assets/pair/target", dtype=dtype)
drafter = dj.load_drafter("assets/pair/drafter", dtype=dtype)
prompts = data.load_prompts("assets/pair/heldout_prompts.json")[:n_prompts]
sus = [engine.setup(target, drafter, [p], method="ddtree", budget=budget, max_new_tokens=max_new) for p in prompts]
max_len = max(s.max_len for s in sus)
sus = [engine.setup(target, drafter, [p], method="ddtree", budget=budget, max_new_tokens=max_new, max_len=max_len)
       for p in prompts]
plan, tp, dp = sus[0].plan, target[1], drafter[1]
pre = [engine.prefill(target, drafter, s) for s in sus]

step_a = engine.decode_steps.lower(tp, dp, pre[0], plan, k).compile()
only = jax.jit(lambda t, d, s: jax.lax.fori_loop(0, k, lambda _, x: engine.speculative_step(t, d, x, plan), s),
               donate_argnums=(2,))
step_b0 = only.lower(tp, dp, pre[0]).compile()
left_fn = jax.jit(engine.tokens_left).lower(pre[0]).compile()

def step_b(t, d, s):
    s = step_b0(t, d, s)
    return s, left_fn(s)

copy = functools.partial(jax.tree_util.tree_map, jnp.copy)
res = {"A": [], "B": []}
disp = {"A": [], "B": []}
toks = {}
for name, fn in (("A", step_a), ("B", step_b)):
    jax.block_until_ready(fn(tp, dp, copy(pre[0])))
for rep in range(reps):
    for name, fn in (("A", step_a), ("B", step_b)) if rep % 2 == 0 else (("B", step_b), ("A", step_a)):
        wall = 0.0
        for i, p0 in enumerate(pre):
            d = []
            def timed(t, dd, s, fn=fn, d=d):
                t0 = time.perf_counter(); out = fn(t, dd, s); d.append(time.perf_counter() - t0); return out
            s = jax.block_until_ready(copy(p0))
            t0 = time.perf_counter()
            s = engine.decode(timed, tp, dp, s, -(-sus[i].max_steps // k), max_lag=1, steps_per_call=k, pace=True)
            s.out_len.block_until_ready()
            wall += time.perf_counter() - t0
            disp[name] += d
            toks.setdefault((name, i), np.asarray(s.out_tokens)[0, :int(s.out_len[0])].tolist())
        res[name].append(wall)
same = all(toks[("A", i)] == toks[("B", i)] for i in range(len(pre)))
out = dict(flags=os.environ.get("XLA_FLAGS", ""), walls_ms={n: [w * 1e3 for w in v] for n, v in res.items()},
           dispatch_ms_median={n: float(np.median(v) * 1e3) for n, v in disp.items()}, same_tokens=same,
           tokens=sum(len(toks[("A", i)]) - 1 for i in range(len(pre))))
print(json.dumps(out))
if os.environ.get("OUT"):
    tag = "skiptemp" if "SKIP_TEMP" in out["flags"] else "default"
    json.dump(out, open(os.path.join(os.environ["OUT"], f"probe_left_{tag}.json"), "w"), indent=1)
