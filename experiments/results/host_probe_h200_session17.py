"""Session-17 probe: after CompiledDecode's placement, how much of a device-loop decode's
per-decode overhead is host time before the device starts? Plain vs behind a ~2 ms dummy matmul.
Run on the first, uncommitted CompiledDecode (it placed inside __call__ when given a new state;
079159e moved that to load()). Kept as run; BENCHMARKS.md issue 7, "Session 17".
"""
import dataclasses, functools, json, os, time
import jax, jax.numpy as jnp, numpy as np
import ddtree_jax as dj
from ddtree_jax import data, engine
out = os.environ.get("OUT", ".")
target = dj.load_target("assets/pair/target", dtype=jnp.bfloat16)
drafter = dj.load_drafter("assets/pair/drafter", dtype=jnp.bfloat16)
prompts = data.load_prompts("assets/pair/heldout_prompts.json")
tp, dp = target[1], drafter[1]
copy = functools.partial(jax.tree_util.tree_map, jnp.copy)
su = engine.setup(target, drafter, [prompts[0]], method="ddtree", budget=64, max_new_tokens=512)
pres = {n: jax.block_until_ready(engine.prefill(target, drafter, dataclasses.replace(su, max_new=np.array([n], np.int32))))
        for n in (128, 512)}
call = engine.compile_decode(tp, dp, pres[128], su, 2, "device")
x = jnp.ones((8192, 8192), jnp.bfloat16)
dummy = jax.jit(lambda a: (a @ a).sum()).lower(x).compile()
jax.block_until_ready(dummy(x)); jax.block_until_ready(call(tp, dp, copy(pres[128])))
trivial = jax.jit(lambda tp, dp, s: s.replace(step=s.step + 1), donate_argnums=2).lower(tp, dp, pres[128]).compile()
R = {k: [] for k in ("dummy", "plain128", "plain512", "over128", "over512", "place128", "exec128", "trivial")}
steps = {}
for rep in range(11):
    for n in (128, 512):
        st = jax.block_until_ready(copy(pres[n]))
        t0 = time.perf_counter()
        if call._buffers is not None:
            st = engine._place(call._buffers, st)
        t1 = time.perf_counter()
        fin = call(tp, dp, st)
        t2 = time.perf_counter()
        fin.out_len.block_until_ready()
        t3 = time.perf_counter()
        R[f"plain{n}"].append(t3 - t0); steps[n] = int(fin.step)
        if n == 128:
            R["place128"].append(t1 - t0); R["exec128"].append(t2 - t1)
        st = jax.block_until_ready(copy(pres[n]))
        t0 = time.perf_counter()
        d = dummy(x)
        fin = call(tp, dp, st)
        fin.out_len.block_until_ready()
        R[f"over{n}"].append(time.perf_counter() - t0)
    t0 = time.perf_counter(); jax.block_until_ready(dummy(x)); R["dummy"].append(time.perf_counter() - t0)
    s = jax.block_until_ready(copy(pres[128]))
    t0 = time.perf_counter(); s = trivial(tp, dp, s); R["trivial"].append(time.perf_counter() - t0)
med = {k: 1e3 * float(np.median(v)) for k, v in R.items()}
print("steps", steps)
for k, v in med.items():
    print(f"{k:10s} {v:8.3f} ms")
for kind in ("plain", "over"):
    a, b = med[f"{kind}128"], med[f"{kind}512"]
    if kind == "over":
        a, b = a - med["dummy"], b - med["dummy"]
    slope = (b - a) / (steps[512] - steps[128])
    print(f"{kind}: {1e3*slope:.1f} us/step, intercept {a - slope*steps[128]:.3f} ms per decode")
json.dump(dict(steps=steps, median_ms=med, raw_ms={k: [1e3 * t for t in v] for k, v in R.items()},
               date=time.strftime("%Y-%m-%d"), jax=jax.__version__), open(os.path.join(out, "host_probe.json"), "w"), indent=1)
