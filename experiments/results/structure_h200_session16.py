"""Session-16 probe (kept as run; BENCHMARKS.md issue 7, "Session 16"), on the H200:
`PYTHONPATH=. python3 experiments/results/structure_h200_session16.py default 7`, and with XLA_FLAGS=GRAPHS_ALL and tag graphs_all.
 wall time of the same 24 ddtree@64 steps (prompt 0, 1 stream) run through
different call/loop structures, untraced, from a fresh copy each rep (median of REPS).
  python3 experiments/results/structure_h200_session16.py TAG REPS"""
import functools, json, os, sys, time
import jax, jax.numpy as jnp, numpy as np
import ddtree_jax as dj
from ddtree_jax import data, engine

out = os.environ.get("OUT", "/tmp")
tag, reps = sys.argv[1], int(sys.argv[2])
target = dj.load_target("assets/pair/target", dtype=jnp.bfloat16)
drafter = dj.load_drafter("assets/pair/drafter", dtype=jnp.bfloat16)
prompts = data.load_prompts("assets/pair/heldout_prompts.json")
copy = functools.partial(jax.tree_util.tree_map, jnp.copy)


def unrolled_step(tp, dp, state, plan, steps):
    for _ in range(steps):
        state = engine.speculative_step(tp, dp, state, plan)
    return state, engine.tokens_left(state)


def unrolled_device(tp, dp, state, plan, steps, max_iters):
    def more(c):
        return (c[1] < max_iters) & jnp.any(engine.tokens_left(c[0]) > 0)
    def body(c):
        return unrolled_step(tp, dp, c[0], plan, steps)[0], c[1] + 1
    s, _ = jax.lax.while_loop(more, body, (state, jnp.zeros((), jnp.int32)))
    return s, engine.tokens_left(s)


u_step = jax.jit(unrolled_step, static_argnames=("plan", "steps"), donate_argnames=("state",))
u_dev = jax.jit(unrolled_device, static_argnames=("plan", "steps", "max_iters"), donate_argnames=("state",))
res = {"tag": tag, "xla_flags": os.environ.get("XLA_FLAGS", ""), "rows": []}
for method in ("ddtree", "ar"):
    su = engine.setup(target, drafter, [prompts[0]], method=method, budget=64, max_new_tokens=128)
    tp, dp = target[1], drafter[1] if method != "ar" else None
    pre = engine.prefill(target, drafter, su)
    n = 24 if method == "ddtree" else 128
    mi = lambda k: -(-su.max_steps // k)
    structs = {}
    for k in ((1, 2, 4) if method == "ddtree" else (1, 8)):
        structs[f"host k={k} fori"] = ("host", k,
                                       engine.decode_steps.lower(tp, dp, pre, su.plan, k).compile())
        if k > 1 and method == "ddtree":
            structs[f"host k={k} unrolled"] = ("host", k, u_step.lower(tp, dp, pre, su.plan, k).compile())
    if method == "ddtree":
        for k in (1, 2, 4):
            structs[f"device k={k} fori"] = ("device", k, engine._decode_all.lower(tp, dp, pre, su.plan, k, mi(k)).compile())
        structs["device k=2 unrolled"] = ("device", 2, u_dev.lower(tp, dp, pre, su.plan, 2, mi(2)).compile())
        structs["one call, 24-step fori"] = ("host", n,
                                             engine.decode_steps.lower(tp, dp, pre, su.plan, n).compile())
    for name, (kind, k, fn) in structs.items():
        jax.block_until_ready(fn(tp, dp, copy(pre)))
        walls, firsts, steps = [], [], 0
        for _ in range(reps):
            s = jax.block_until_ready(copy(pre))
            t0 = time.perf_counter()
            if kind == "device":
                s = fn(tp, dp, s)[0]
                t1 = time.perf_counter()
            else:
                for c in range(-(-n // k)):
                    s, _ = fn(tp, dp, s)
                    if c == 0:
                        t1 = time.perf_counter()
            s.out_len.block_until_ready()
            walls.append(time.perf_counter() - t0); firsts.append(t1 - t0)
            steps = int(s.step)
        row = dict(method=method, structure=name, steps=steps, wall_ms=float(np.median(walls)) * 1e3,
                   first_call_returns_ms=float(np.median(firsts)) * 1e3)
        row["ms_per_step"] = row["wall_ms"] / steps
        res["rows"].append(row)
        print(f"{tag} {method:6s} {name:24s} steps {steps:4d} wall {row['wall_ms']:7.2f} ms  "
              f"{row['ms_per_step']*1e3:6.1f} us/step  first call returns {row['first_call_returns_ms']:.3f} ms", flush=True)
json.dump(res, open(os.path.join(out, f"structure_{tag}.json"), "w"), indent=1)
