"""Session-12 probe, kept as run on the H200 at 386af4b (BENCHMARKS.md "Session 12"): `OUT=.
PYTHONPATH=. python3 experiments/results/state_source_h200_session12.py 15`, with default XLA flags
and with XLA_FLAGS=--xla_gpu_command_buffer_update_mode=SKIP_TEMP -> state_probe2.json, saved as
state_source_h200_session12_{call3,default,skip_temp}.json.
Where a decode's state buffers come from vs the device-loop decode's wall time (ddtree@64 k=2, 1 stream).
modes: leafcopy (tree_map jnp.copy), jitcopy (one jitted copy), prefill (engine.prefill),
prefill_copy (prefill, then one jitted copy), into (jitted copy into the previous final state's
donated buffers), prefill_into (prefill into the previous final state's donated buffers)."""
import functools, json, os, sys, time
import jax, jax.numpy as jnp, numpy as np
import ddtree_jax as dj
from ddtree_jax import data, engine

out = os.environ.get("OUT", "/tmp")
reps = int(sys.argv[1]) if len(sys.argv) > 1 else 15
target = dj.load_target("assets/pair/target", dtype=jnp.bfloat16)
drafter = dj.load_drafter("assets/pair/drafter", dtype=jnp.bfloat16)
prompts = data.load_prompts("assets/pair/heldout_prompts.json")
leafcopy = functools.partial(jax.tree_util.tree_map, jnp.copy)
jitcopy = jax.jit(lambda s: jax.tree_util.tree_map(jnp.copy, s))
into = jax.jit(lambda old, s: jax.tree_util.tree_map(jnp.copy, s), donate_argnums=0)
res = {}
for method, k in (("ddtree", 2), ("ar", 8)):
    su = engine.setup(target, drafter, [prompts[0]], method=method, budget=64, max_new_tokens=128)
    tp, dp = target[1], drafter[1] if method != "ar" else None
    args = (tp, dp, jnp.asarray(su.prompts), jnp.asarray(su.lengths), jnp.asarray(su.max_new), jax.random.key(0))
    statics = dict(plan=su.plan, max_len=su.max_len, max_out=su.max_out, max_steps=su.max_steps)
    pre_into = jax.jit(lambda old, *a: engine.initial_state(*a, **statics), donate_argnums=0)
    pre = engine.prefill(target, drafter, su)
    fn = engine.compile_decode(tp, dp, pre, su, k, "device")
    info = {}
    try:
        want = jax.tree_util.tree_leaves(fn.input_shardings[0][2])
        have = [x.sharding for x in jax.tree_util.tree_leaves(pre)]
        info["sharding_mismatch"] = [i for i, (a, b) in enumerate(zip(want, have)) if a != b]
    except Exception as e:
        info["sharding_check_error"] = str(e)[:200]
    try:
        want = jax.tree_util.tree_leaves(fn.input_formats[0][2])
        have = [getattr(x, "format", None) for x in jax.tree_util.tree_leaves(pre)]
        info["format_mismatch"] = [(i, str(a), str(b)) for i, (a, b) in enumerate(zip(want, have)) if b is not None and a != b]
    except Exception as e:
        info["format_check_error"] = str(e)[:200]
    print(method, info, flush=True)
    jax.block_until_ready(fn(tp, dp, leafcopy(pre)))
    modes = ("leafcopy", "jitcopy", "prefill", "prefill_copy", "into", "prefill_into")
    times = {m: [] for m in modes}
    last = jax.block_until_ready(fn(tp, dp, jitcopy(pre)))[0]
    outs = {}
    for _ in range(reps):
        for mode in modes:
            if mode == "leafcopy": s = leafcopy(pre)
            elif mode == "jitcopy": s = jitcopy(pre)
            elif mode == "prefill": s = engine.prefill(target, drafter, su)
            elif mode == "prefill_copy": s = jitcopy(engine.prefill(target, drafter, su))
            elif mode == "into": s = into(last, pre)
            else: s = pre_into(last, *args)
            s = jax.block_until_ready(s)
            t0 = time.perf_counter(); o = fn(tp, dp, s); jax.block_until_ready(o)
            times[mode].append(time.perf_counter() - t0)
            last = o[0]
            outs[mode] = np.asarray(o[0].out_tokens)
    same = all(np.array_equal(outs[m], outs["leafcopy"]) for m in modes)
    res[method] = dict(info, same_tokens=same, **{m: float(np.median(v)) * 1e6 for m, v in times.items()})
    print(method, "same tokens:", same, {m: round(float(np.median(v)) * 1e6, 1) for m, v in times.items()}, flush=True)
json.dump(res, open(os.path.join(out, "state_probe2.json"), "w"), indent=1)
