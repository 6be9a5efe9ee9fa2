"""Session-11 probe (kept as run; BENCHMARKS.md "Session 11"), on the H200:
`PYTHONPATH=. python3 experiments/results/call_cost_h200_session11.py default 30`, and with
XLA_FLAGS=--xla_gpu_command_buffer_update_mode=SKIP_TEMP and tag skip_temp.
What one call costs beyond its kernels, from a fresh state (new buffer addresses) and chained
(the donated state's own buffers, as inside a host loop): ddtree@64 and ar at 1 stream."""
import functools, json, os, sys, time
import jax, jax.numpy as jnp, numpy as np
import ddtree_jax as dj
from ddtree_jax import data, engine

out = os.environ.get("OUT", "/tmp")
tag = sys.argv[1] if len(sys.argv) > 1 else "default"
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 30
dt = jnp.bfloat16 if jax.default_backend() == "gpu" else jnp.float32
target = dj.load_target("assets/pair/target", dtype=dt)
drafter = dj.load_drafter("assets/pair/drafter", dtype=dt)
prompts = data.load_prompts("assets/pair/heldout_prompts.json")
copy = functools.partial(jax.tree_util.tree_map, jnp.copy)
ident = jax.jit(lambda tp, dp, s: (s, engine.tokens_left(s)), donate_argnames=("s",))
res = {}
for method in ("ddtree", "ar"):
    su = engine.setup(target, drafter, [prompts[0]], method=method, budget=64, max_new_tokens=128)
    tp, dp = target[1], drafter[1] if method != "ar" else None
    pre = engine.prefill(target, drafter, su)
    calls = dict(
        identity=ident.lower(tp, dp, pre).compile(),
        device_loop_1=engine._decode_all.lower(tp, dp, pre, su.plan, 1, 1).compile(),
        step_1=engine.decode_steps.lower(tp, dp, pre, su.plan, 1).compile(),
        step_2=engine.decode_steps.lower(tp, dp, pre, su.plan, 2).compile())
    r = {}
    for name, fn in calls.items():
        jax.block_until_ready(fn(tp, dp, copy(pre)))
        fresh, chained, disp = [], [], []
        for _ in range(reps):
            s = jax.block_until_ready(copy(pre))
            t0 = time.perf_counter(); o = fn(tp, dp, s); t1 = time.perf_counter(); jax.block_until_ready(o)
            fresh.append(time.perf_counter() - t0); disp.append(t1 - t0)
        s = jax.block_until_ready(copy(pre))
        for _ in range(reps):
            t0 = time.perf_counter(); s, l = fn(tp, dp, s); jax.block_until_ready(l)
            chained.append(time.perf_counter() - t0)
        r[name] = dict(fresh_us=float(np.median(fresh)) * 1e6, chained_us=float(np.median(chained)) * 1e6,
                       fresh_dispatch_us=float(np.median(disp)) * 1e6)
        print(tag, method, name, {k: round(v, 1) for k, v in r[name].items()}, flush=True)
    res[method] = r
json.dump(res, open(os.path.join(out, f"lead_{tag}.json"), "w"), indent=1)
