"""Session-11 probe (kept as run; BENCHMARKS.md "Session 11"), on the H200:
`PYTHONPATH=. python3 experiments/results/decode_gaps_h200_session11.py 64 2` (budget, k).
Where a 1-stream ddtree decode's time goes beyond its kernels: untraced walls of one fixed call of
N steps vs the device loop, and a traced device-loop decode's gaps with the kernels around them and
the host events overlapping them."""
import functools, glob, gzip, json, os, sys, tempfile, time
import jax, jax.numpy as jnp, numpy as np
import ddtree_jax as dj
from ddtree_jax import bench_util, data, engine

out = os.environ.get("OUT", "/tmp")
budget, k = int(sys.argv[1]), int(sys.argv[2])
target = dj.load_target("assets/pair/target", dtype=jnp.bfloat16)
drafter = dj.load_drafter("assets/pair/drafter", dtype=jnp.bfloat16)
prompts = data.load_prompts("assets/pair/heldout_prompts.json")
res = {}
for pi in (0, 1):
    su = engine.setup(target, drafter, [prompts[pi]], method="ddtree", budget=budget, max_new_tokens=128)
    tp, dp = target[1], drafter[1]
    pre = engine.prefill(target, drafter, su)
    copy = functools.partial(jax.tree_util.tree_map, jnp.copy)
    maxc = -(-su.max_steps // k)
    dev = engine._decode_all.lower(tp, dp, pre, su.plan, k, maxc).compile()
    st, _ = dev(tp, dp, copy(pre)); n = int(st.step)
    fixed = engine.decode_steps.lower(tp, dp, pre, su.plan, n).compile()
    one = engine.decode_steps.lower(tp, dp, pre, su.plan, 1).compile()
    jax.block_until_ready(fixed(tp, dp, copy(pre)))
    def t_call(fn, reps=15):
        ws, ds = [], []
        for _ in range(reps):
            s = jax.block_until_ready(copy(pre))
            t0 = time.perf_counter(); o = fn(tp, dp, s); t1 = time.perf_counter()
            jax.block_until_ready(o); t2 = time.perf_counter()
            ws.append(t2 - t0); ds.append(t1 - t0)
        return float(np.median(ws)) * 1e3, float(np.median(ds)) * 1e3
    def t_ones(reps=15):   # n one-step calls back to back, no reads
        ws = []
        for _ in range(reps):
            s = jax.block_until_ready(copy(pre))
            t0 = time.perf_counter()
            for _ in range(n): s, l = one(tp, dp, s)
            jax.block_until_ready(s); ws.append(time.perf_counter() - t0)
        return float(np.median(ws)) * 1e3
    r = dict(steps=n, device_loop=t_call(dev), fixed_call=t_call(fixed), one_step_calls=t_ones())
    # traced device-loop decode and traced fixed call
    for name, fn in (("device_loop", dev), ("fixed_call", fixed)):
        s = jax.block_until_ready(copy(pre))
        with tempfile.TemporaryDirectory() as d:
            with jax.profiler.trace(d):
                o = jax.block_until_ready(fn(tp, dp, s))
            ks, _ = bench_util.device_kernels(d)
            f = sorted(glob.glob(os.path.join(d, "**", "*.trace.json.gz"), recursive=True))[-1]
            with gzip.open(f, "rt") as fh: ev = json.load(fh)["traceEvents"]
        host = [e for e in ev if e.get("ph") == "X" and e.get("name") and "Stream" not in str(e.get("tid"))]
        ks = sorted(ks, key=lambda e: e["ts"])
        if not ks: continue
        t = bench_util.kernel_timeline(ks, 5.0)
        gaps, reach, prev = [], ks[0]["ts"] + ks[0]["dur"], ks[0]["name"]
        for e in ks[1:]:
            if e["ts"] - reach > 5.0:
                over = sorted({h["name"][:60] for h in host if h["ts"] < e["ts"] and h["ts"] + h.get("dur", 0) > reach
                               and h.get("dur", 0) < 5e4})[:8]
                gaps.append(dict(at_us=round(reach - ks[0]["ts"], 1), us=round(e["ts"] - reach, 1), after=prev[:50], before=e["name"][:50], host=over))
            if e["ts"] + e["dur"] > reach: reach, prev = e["ts"] + e["dur"], e["name"]
        r[name + "_trace"] = dict(t, kernels=len(ks), gaps_list=gaps)
    res[pi] = r
    print(pi, {k2: v for k2, v in r.items() if not k2.endswith("_trace")})
    for name in ("device_loop", "fixed_call"):
        tr = r.get(name + "_trace")
        if tr is None: continue
        print(f"  {name} traced: busy {tr['busy_ms']:.2f} span {tr['span_ms']:.2f} gaps>5us {tr['gaps']} sum {tr['gap_ms']:.2f} ms kernels {tr['kernels']}")
        for g in tr["gaps_list"][:40]: print("   ", g)
json.dump(res, open(os.path.join(out, f"gaps_{budget}_{k}.json"), "w"), indent=1)
