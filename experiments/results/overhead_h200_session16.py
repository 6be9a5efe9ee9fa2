"""Session-16 probe (BENCHMARKS.md issue 7, "Session 16"), on the H200:
`PYTHONPATH=. python3 experiments/results/overhead_h200_session16.py TAG 5`.
Every held-out prompt alone (20), 128 new tokens, bf16 pair; per prompt the median of REPS decodes,
summed. Each variant from a "fresh" copy of the prefilled state (new buffer addresses, as
decode_timeline and generate do) and "placed": the prefilled state copied into the previous
decode's buffers (a donated copy), so every decode sees the same addresses.
As kept, ddtree@64's device loop (k=2) is compiled with engine.DEVICE_LOOP_GRAPHS ("graphs") and
with XLA's defaults ("xla"), and ar's host loop (k=8) with the defaults
(overhead_h200_session16_graph_options.json). The first run of this probe (before the engine
change; tags default and graphs_all, the latter under XLA_FLAGS=GRAPHS_ALL;
overhead_h200_session16_unroll_*.json) compared instead engine._decode_all / engine.decode_steps ("fori":
a fori_loop of k steps) with the k steps written out in the loop body ("unroll")."""
import functools, json, os, sys, time
import jax, jax.numpy as jnp, numpy as np
import ddtree_jax as dj
from ddtree_jax import data, engine

out = os.environ.get("OUT", "/tmp")
tag = sys.argv[1]; reps = int(sys.argv[2])
target = dj.load_target("assets/pair/target", dtype=jnp.bfloat16)
drafter = dj.load_drafter("assets/pair/drafter", dtype=jnp.bfloat16)
prompts = data.load_prompts("assets/pair/heldout_prompts.json")[:int(os.environ.get("NPROMPTS", "20"))]
copy = functools.partial(jax.tree_util.tree_map, jnp.copy)
place = jax.jit(lambda dst, src: jax.tree_util.tree_map(lambda d, x: d.at[...].set(x), dst, src),
              donate_argnums=0)


def unrolled_device(tp, dp, state, plan, steps, max_iters):
    def more(c):
        return (c[1] < max_iters) & jnp.any(engine.tokens_left(c[0]) > 0)
    def body(c):
        s = c[0]
        for _ in range(steps):
            s = engine.speculative_step(tp, dp, s, plan)
        return s, c[1] + 1
    s, _ = jax.lax.while_loop(more, body, (state, jnp.zeros((), jnp.int32)))
    return s, engine.tokens_left(s)


def unrolled_step(tp, dp, state, plan, steps):
    for _ in range(steps):
        state = engine.speculative_step(tp, dp, state, plan)
    return state, engine.tokens_left(state)


u_dev = jax.jit(unrolled_device, static_argnames=("plan", "steps", "max_iters"), donate_argnames=("state",))
u_step = jax.jit(unrolled_step, static_argnames=("plan", "steps"), donate_argnames=("state",))
res = {"tag": tag, "xla_flags": os.environ.get("XLA_FLAGS", ""), "jax": jax.__version__, "points": {}}
for method, k in (("ddtree", 2), ("ar", 8)):
    kw = dict(method=method, budget=64, max_new_tokens=128)
    sus = [engine.setup(target, drafter, [p], **kw) for p in prompts]
    ml = max(s.max_len for s in sus)
    sus = [engine.setup(target, drafter, [p], max_len=ml, **kw) for p in prompts]
    su = sus[0]
    tp, dp = target[1], drafter[1] if method != "ar" else None
    pre = [engine.prefill(target, drafter, s) for s in sus]
    loop = "device" if method == "ddtree" else "host"
    t0 = time.perf_counter()
    if loop == "device":
        mi = -(-su.max_steps // k)
        calls = {"graphs": engine.compile_decode(tp, dp, pre[0], su, k, "device"),
                 "xla": engine.compile_decode(tp, dp, pre[0], su, k, "device", device_graphs=False)}
    else:
        calls = {"xla": engine.decode_steps.lower(tp, dp, pre[0], su.plan, k).compile()}
    print(tag, method, "compile s", round(time.perf_counter() - t0, 1), flush=True)
    for c in calls.values():
        jax.block_until_ready(c(tp, dp, copy(pre[0])))
    walls = {(v, m): [[] for _ in prompts] for v in calls for m in ("fresh", "placed")}
    leads = {key: [] for key in walls}
    finals, prev = {}, {v: copy(pre[0]) for v in calls}
    same_addr = None
    for r in range(reps):
        for b, p in enumerate(pre):
            for v, c in calls.items():
                for m in ("fresh", "placed"):
                    if m == "fresh":
                        s = copy(p)
                    else:
                        before = prev[v].out_tokens.unsafe_buffer_pointer()
                        s = place(prev[v], p)
                        if same_addr is None:
                            same_addr = s.out_tokens.unsafe_buffer_pointer() == before
                    jax.block_until_ready(s)
                    t0 = time.perf_counter()
                    if loop == "device":
                        s = c(tp, dp, s)[0]
                    else:
                        s = engine.run_decode(c, tp, dp, s, sus[b], k, "host")
                    t1 = time.perf_counter()
                    s.out_len.block_until_ready()
                    walls[(v, m)][b].append(time.perf_counter() - t0)
                    leads[(v, m)].append(t1 - t0)
                    if m == "placed":
                        prev[v] = s
                    finals[(v, m, b)] = (np.asarray(s.out_tokens), int(s.step))
    ref = {b: finals[("xla", "fresh", b)][0] for b in range(len(pre))}
    for (v, m, b), (tok, _) in finals.items():
        assert np.array_equal(tok, ref[b]), (v, m, b)
    pt = {}
    for (v, m), w in walls.items():
        pt[f"{v}/{m}"] = dict(ms=float(sum(np.median(x) for x in w)) * 1e3,
                              call_return_ms=float(np.median(leads[(v, m)])) * 1e3,
                              device_steps=sum(finals[(v, m, b)][1] for b in range(len(pre))))
    res["points"][method] = dict(k=k, loop=loop, same_address_after_place=bool(same_addr), **pt)
    print(tag, method, "placed keeps addresses:", same_addr, flush=True)
    for key, x in pt.items():
        print(f"{tag} {method:6s} {key:14s} {x['ms']:8.1f} ms  call returns {x['call_return_ms']:.3f} ms  steps {x['device_steps']}", flush=True)
json.dump(res, open(os.path.join(out, f"overhead_{tag}.json"), "w"), indent=1)
