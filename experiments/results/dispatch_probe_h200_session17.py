"""Session-17 probe: host time of one call, by argument count, donation and call path.
Run on the first, uncommitted CompiledDecode (placing inside __call__); the "decode" rows use it.
Kept as run; BENCHMARKS.md issue 7, "Session 17".
"""
import cProfile, functools, io, json, os, pstats, time
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
small = jnp.ones((4,), jnp.float32)

def timeit(fn, make, n=50):
    ts = []
    for _ in range(n):
        a = jax.block_until_ready(make())
        t0 = time.perf_counter(); r = fn(*a); ts.append(time.perf_counter() - t0)
        jax.block_until_ready(r)
    return 1e6 * float(np.median(ts))

bump = lambda s: s.replace(step=s.step + 1)
cases = {
    "jit small": (jax.jit(lambda x: x + 1), lambda: (small,)),
    "jit state": (jax.jit(bump), lambda: (copy(pre),)),
    "jit state donated": (jax.jit(bump, donate_argnums=0), lambda: (copy(pre),)),
    "compiled state donated": (jax.jit(bump, donate_argnums=0).lower(pre).compile(), lambda: (copy(pre),)),
    "jit params+state donated": (jax.jit(lambda t, d, s: bump(s), donate_argnums=2), lambda: (tp, dp, copy(pre))),
    "compiled params+state donated": (jax.jit(lambda t, d, s: bump(s), donate_argnums=2).lower(tp, dp, pre).compile(), lambda: (tp, dp, copy(pre))),
    "jit params only": (jax.jit(lambda t, d: t["embed_tokens"] if not isinstance(t["embed_tokens"], dict) else 0), lambda: (tp, dp)),
}
res = {}
for name, (fn, make) in cases.items():
    jax.block_until_ready(fn(*make()))
    res[name] = timeit(fn, make)
    print(f"{name:32s} {res[name]:8.1f} us", flush=True)
# the decode itself: host time of the call, and a cProfile of it
call = engine.compile_decode(tp, dp, pre, su, 2, "device")
jax.block_until_ready(call(tp, dp, copy(pre)))
res["decode (CompiledDecode, placing)"] = timeit(call, lambda: (tp, dp, copy(pre)), n=15)
res["decode executable, no placing"] = timeit(call.executable, lambda: (tp, dp, copy(pre)), n=15)
for k in list(res)[-2:]:
    print(f"{k:32s} {res[k]:8.1f} us", flush=True)
a = jax.block_until_ready((tp, dp, copy(pre)))
pr = cProfile.Profile(); pr.enable(); r = call(*a); pr.disable(); jax.block_until_ready(r)
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(25)
print(s.getvalue()[:5000])
json.dump(res, open(os.path.join(out, "dispatch_probe.json"), "w"), indent=1)
