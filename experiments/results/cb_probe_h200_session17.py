"""Session-17 probe: is the device loop's non-kernel time per decode or per step, and does every
decode re-record the CUDA graph? Part A: walls vs max_new (prompt 0). Part B (env CB_LOG=1): VLOG
of command_buffer_thunk around fresh and placed decodes.
Run at 3f5b6ba (before CompiledDecode): `OUT=. PYTHONPATH=. python3 cb_probe_h200_session17.py`, then
with CB_LOG=1 TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=command_buffer_thunk=3 (log lines kept in
cb_probe_h200_session17_vlog.txt). Kept as run; BENCHMARKS.md issue 7, "Session 17".
"""
import dataclasses, functools, json, os, sys, time
import jax, jax.numpy as jnp, numpy as np
import ddtree_jax as dj
from ddtree_jax import data, engine
out = os.environ.get("OUT", ".")
target = dj.load_target("assets/pair/target", dtype=jnp.bfloat16)
drafter = dj.load_drafter("assets/pair/drafter", dtype=jnp.bfloat16)
prompts = data.load_prompts("assets/pair/heldout_prompts.json")
tp, dp = target[1], drafter[1]
copy = functools.partial(jax.tree_util.tree_map, jnp.copy)
place = jax.jit(lambda dst, src: jax.tree_util.tree_map(lambda d, s: d.at[...].set(s), dst, src),
                donate_argnums=0)
NMAX = int(os.environ.get("NMAX", 512))
NS = tuple(int(x) for x in os.environ.get("NS", "16,32,64,128,256,512").split(","))

def prep(method, budget, k, loop, graphs=True):
    su = engine.setup(target, drafter, [prompts[0]], method=method, budget=budget, max_new_tokens=NMAX)
    pres = {}
    for n in NS:
        s2 = dataclasses.replace(su, max_new=np.array([n], np.int32))
        pres[n] = jax.block_until_ready(engine.prefill(target, drafter, s2))
    call = engine.compile_decode(tp, dp if method != "ar" else None, pres[NS[0]], su, k, loop, device_graphs=graphs)
    return su, pres, call

def one(su, call, state, k, loop, method):
    d = dp if method != "ar" else None
    t0 = time.perf_counter()
    if loop == "device":
        st, left = call(tp, d, state)
        t1 = time.perf_counter()
    else:
        st = engine.run_decode(call, tp, d, state, su, k, loop)
        t1 = time.perf_counter()
    st.out_len.block_until_ready()
    return time.perf_counter() - t0, t1 - t0, st

if os.environ.get("CB_LOG"):
    su, pres, call = prep("ddtree", 64, 2, "device")
    prev = None
    for i in range(8):
        mode = "fresh" if i < 4 else "placed"
        src = pres[NS[-1]]
        if mode == "fresh" or prev is None:
            st = jax.block_until_ready(copy(src))
        else:
            st = jax.block_until_ready(place(prev, src))
        ptrs = [x.unsafe_buffer_pointer() for x in jax.tree_util.tree_leaves(st)]
        print(f"=== DECODE {i} {mode} ptr0={ptrs[0]:x} ===", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        prev, left = call(tp, dp, st)
        t1 = time.perf_counter()
        prev.out_len.block_until_ready()
        t2 = time.perf_counter()
        print(f"=== END {i} {mode} host {1e3*(t1-t0):.3f} ms wall {1e3*(t2-t0):.3f} ms steps {int(prev.step)} left_ptr={left.unsafe_buffer_pointer():x} ===", file=sys.stderr, flush=True)
    sys.exit(0)

res = {"date": time.strftime("%Y-%m-%d"), "jax": jax.__version__, "device": jax.devices()[0].device_kind, "rows": []}
variants = [("ddtree", 64, 2, "device", True), ("ddtree", 64, 2, "device", False),
            ("ddtree", 64, 1, "host", False), ("ar", 0, 8, "host", False)]
preps = {v: prep(*v[:4], graphs=v[4]) for v in variants}
for v, (su, pres, call) in preps.items():   # warm-up
    jax.block_until_ready(one(su, call, copy(pres[NS[0]]), v[2], v[3], v[0])[2])
walls = {(v, n): [] for v in variants for n in NS}
hosts = {(v, n): [] for v in variants for n in NS}
stepsd = {}
for rep in range(int(os.environ.get("REPS", 7))):
    for n in NS:
        for v in variants:
            su, pres, call = preps[v]
            st = jax.block_until_ready(copy(pres[n]))
            w, h, fin = one(su, call, st, v[2], v[3], v[0])
            walls[(v, n)].append(w); hosts[(v, n)].append(h)
            stepsd[(v, n)] = (int(fin.step), int(np.asarray(fin.out_len)[0]))
print("| variant | N | device steps | tokens | wall ms (median of 7) | host ms | us/step |")
for v in variants:
    xs, ys = [], []
    for n in NS:
        w = float(np.median(walls[(v, n)])) * 1e3
        h = float(np.median(hosts[(v, n)])) * 1e3
        s, t = stepsd[(v, n)]
        xs.append(s); ys.append(w)
        res["rows"].append(dict(variant="%s@%d k%d %s graphs=%s" % v, n=n, steps=s, tokens=t, wall_ms=w, host_ms=h,
                                walls=[x * 1e3 for x in walls[(v, n)]]))
        print(f"| {v} | {n} | {s} | {t} | {w:.3f} | {h:.3f} | {1e3*w/s:.1f} |")
    slope, icpt = np.polyfit(xs, ys, 1)
    res.setdefault("fits", []).append(dict(variant="%s@%d k%d %s graphs=%s" % v, us_per_step=slope * 1e3, ms_per_decode=icpt))
    print(f"FIT {v}: {slope*1e3:.1f} us/step + {icpt:.3f} ms per decode")
json.dump(res, open(os.path.join(out, "cb_probe.json"), "w"), indent=1)
