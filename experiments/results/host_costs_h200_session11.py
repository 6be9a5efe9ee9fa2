"""Session-11 probe (kept as run; BENCHMARKS.md "Session 11"): per-decode host costs over all 20
held-out prompts at 1 stream, and what one device->host read of a tiny array costs. Run on the H200:

  PYTHONPATH=. python3 experiments/results/host_costs_h200_session11.py 20 default
  XLA_FLAGS=<GRAPHS_ALL> PYTHONPATH=. python3 experiments/results/host_costs_h200_session11.py 20 graphs_all

Variants per prompt, interleaved, median of 5: dev_call (engine._decode_all, one call), host_calls
(exactly the k-step calls needed, no reads: an oracle), paced (engine.decode reading the starting
counts from the device), paced_hostleft0 (engine.decode told them)."""
import functools, json, os, sys, time
import jax, jax.numpy as jnp, numpy as np
import ddtree_jax as dj
from ddtree_jax import data, engine

out = os.environ.get("OUT", "/tmp")
tag = sys.argv[2] if len(sys.argv) > 2 else "default"
target = dj.load_target("assets/pair/target", dtype=jnp.bfloat16)
drafter = dj.load_drafter("assets/pair/drafter", dtype=jnp.bfloat16)
prompts = data.load_prompts("assets/pair/heldout_prompts.json")
n_prompts = int(sys.argv[1]) if len(sys.argv) > 1 else 20
reps = 5
copy = functools.partial(jax.tree_util.tree_map, jnp.copy)
res = {}
# one small read, several ways (us, median of 50)
x0 = jnp.arange(4, dtype=jnp.int32)
def rd(mode):
    ts = []
    for _ in range(50):
        x = jax.block_until_ready(x0 + 1)
        t0 = time.perf_counter()
        if mode == "asarray": np.asarray(x)
        elif mode == "device_get": jax.device_get(x)
        elif mode == "async_then_asarray": x.copy_to_host_async(); np.asarray(x)
        elif mode == "three_asarray": y = jax.block_until_ready(x0 + 2); z = jax.block_until_ready(x0 + 3); t0 = time.perf_counter(); np.asarray(x); np.asarray(y); np.asarray(z)
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts)) * 1e6
res["read_us"] = {m: rd(m) for m in ("asarray", "device_get", "async_then_asarray", "three_asarray")}
print(tag, "read us", res["read_us"], flush=True)
for method, budget, ks in (("ddtree", 64, (2, 3, 4)), ("ar", 0, (8,))):
    sus = [engine.setup(target, drafter, [prompts[i]], method=method, budget=max(budget, 1), max_new_tokens=128)
           for i in range(n_prompts)]
    ml = max(s.max_len for s in sus)
    sus = [engine.setup(target, drafter, [prompts[i]], method=method, budget=max(budget, 1), max_new_tokens=128, max_len=ml)
           for i in range(n_prompts)]
    tp, dp = target[1], drafter[1] if method != "ar" else None
    pres = [engine.prefill(target, drafter, s) for s in sus]
    plan = sus[0].plan
    left0 = sus[0].max_new - 1
    for k in ks:
        maxc = -(-sus[0].max_steps // k)
        dev = engine._decode_all.lower(tp, dp, pres[0], plan, k, maxc).compile()
        step = engine.decode_steps.lower(tp, dp, pres[0], plan, k).compile()
        nsteps = [int(dev(tp, dp, copy(p))[0].step) for p in pres]
        jax.block_until_ready(step(tp, dp, copy(pres[0])))
        def v_dev_call(s, i):
            return dev(tp, dp, s)[0]
        def v_host_calls(s, i):        # exactly the useful calls back to back, no reads (an oracle)
            for _ in range(-(-nsteps[i] // k)): s, l = step(tp, dp, s)
            return s
        def v_paced(s, i):
            return engine.decode(step, tp, dp, s, maxc, max_lag=max(1, 3 // k), steps_per_call=k, pace=k > 1)
        def v_paced_hl(s, i):
            return engine.decode(step, tp, dp, s, maxc, max_lag=max(1, 3 // k), steps_per_call=k, pace=k > 1, left0=left0)
        variants = dict(dev_call=v_dev_call, host_calls=v_host_calls, paced=v_paced, paced_hostleft0=v_paced_hl)
        walls = {v: [[] for _ in pres] for v in variants}
        for _ in range(reps):
            for i, p in enumerate(pres):
                for v, fn in variants.items():
                    s = jax.block_until_ready(copy(p))
                    t0 = time.perf_counter(); s = fn(s, i); s.out_len.block_until_ready()
                    walls[v][i].append(time.perf_counter() - t0)
        r = {v: float(sum(np.median(w) for w in ws)) * 1e3 for v, ws in walls.items()}
        r["steps"] = sum(nsteps)
        res[f"{method}@{budget} k={k}"] = r
        print(tag, f"{method}@{budget} k={k}", {a: round(b, 1) for a, b in r.items()}, flush=True)
json.dump(res, open(os.path.join(out, f"hostcost2_{tag}.json"), "w"), indent=1)
