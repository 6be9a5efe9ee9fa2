"""Session-16 probe (kept as run; BENCHMARKS.md issue 7, "Session 16"), on the H200:
`PYTHONPATH=. python3 experiments/results/graphs_h200_session16.py run1 7 ar:8:d,ar:8:g,ddtree64:2:d,ddtree64:2:g,ddtree64:1:g,ddtree64:4:g,ddtree96:2:d,ddtree96:2:g,ddtree128:2:g`, then `run2 7 ddtree64:2:g,ar:8:d,ddtree64:2:d` and `run3 7 ar:8:d,ddtree64:2:d,ddtree64:2:g`.
 the goal figure's decodes (every held-out prompt alone, 128 new tokens, bf16
pair), each variant compiled in this one process and run interleaved (per rep, per prompt):
ddtree's device loop and ar's host loop compiled with XLA's default command buffers or with while
loops and conditionals recorded into CUDA graphs too (GRAPHS_ALL, as per-executable compile options).
  python3 experiments/results/graphs_h200_session16.py TAG REPS VARIANTS (e.g. ar:8:d,ar:8:g,ddtree64:2:d,ddtree64:2:g)"""
import functools, json, os, sys, time
import jax, jax.numpy as jnp, numpy as np
import ddtree_jax as dj
from ddtree_jax import data, engine

GRAPHS_ALL = {"xla_gpu_enable_command_buffer": "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,"
              "DYNAMIC_SLICE_FUSION,WHILE,CONDITIONAL", "xla_gpu_graph_min_graph_size": 1}
out = os.environ.get("OUT", "/tmp")
tag, reps, names = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
target = dj.load_target("assets/pair/target", dtype=jnp.bfloat16)
drafter = dj.load_drafter("assets/pair/drafter", dtype=jnp.bfloat16)
prompts = data.load_prompts("assets/pair/heldout_prompts.json")[:int(os.environ.get("NPROMPTS", "20"))]
copy = functools.partial(jax.tree_util.tree_map, jnp.copy)
variants = {}
for name in names:
    m, k, g = name.split(":")
    method = "ar" if m == "ar" else "ddtree"
    budget = 64 if m == "ar" else int(m[len("ddtree"):])
    k = int(k)
    kw = dict(method=method, budget=budget, max_new_tokens=128)
    sus = [engine.setup(target, drafter, [p], **kw) for p in prompts]
    ml = max(s.max_len for s in sus)
    sus = [engine.setup(target, drafter, [p], max_len=ml, **kw) for p in prompts]
    su = sus[0]
    tp, dp = target[1], drafter[1] if method != "ar" else None
    pre = [engine.prefill(target, drafter, s) for s in sus]
    loop = "device" if method == "ddtree" else "host"
    opts = GRAPHS_ALL if g == "g" else None
    t0 = time.perf_counter()
    if loop == "device":
        low = engine._decode_all.lower(tp, dp, pre[0], su.plan, k, -(-su.max_steps // k))
    else:
        low = engine.decode_steps.lower(tp, dp, pre[0], su.plan, k)
    call = low.compile(compiler_options=opts) if opts else low.compile()
    jax.block_until_ready(call(tp, dp, copy(pre[0])))
    print(tag, name, "compiled + warm", round(time.perf_counter() - t0, 1), "s", flush=True)
    variants[name] = dict(call=call, sus=sus, pre=pre, tp=tp, dp=dp, k=k, loop=loop,
                          walls=[[] for _ in prompts], final={})
for r in range(reps):
    for b in range(len(prompts)):
        for name, v in variants.items():
            s = jax.block_until_ready(copy(v["pre"][b]))
            t0 = time.perf_counter()
            if v["loop"] == "device":
                s = v["call"](v["tp"], v["dp"], s)[0]
            else:
                s = engine.run_decode(v["call"], v["tp"], v["dp"], s, v["sus"][b], v["k"], "host")
            s.out_len.block_until_ready()
            v["walls"][b].append(time.perf_counter() - t0)
            v["final"][b] = (np.asarray(s.out_tokens)[0, :int(s.out_len[0])], np.asarray(s.accept), int(s.step))
res = {"tag": tag, "jax": jax.__version__, "reps": reps, "prompts": len(prompts), "variants": {}}
ar_ref = next((v["final"] for n, v in variants.items() if n.startswith("ar")), None)
mismatch = []
for name, v in variants.items():   # same method and budget: identical tokens required
    first = next(n for n in names if n.split(":")[0] == name.split(":")[0])
    for b in range(len(prompts)):
        if not np.array_equal(v["final"][b][0], variants[first]["final"][b][0]):
            mismatch.append((name, b))
    acc = np.concatenate([f[1][f[1] > 0] for f in v["final"].values()])
    ms = float(sum(np.median(w) for w in v["walls"])) * 1e3
    res["variants"][name] = dict(ms=ms, tau=float(acc.mean()), steps=int(acc.size),
                                 device_steps=sum(f[2] for f in v["final"].values()),
                                 per_prompt_ms=[float(np.median(w)) * 1e3 for w in v["walls"]],
                                 prompts_equal_to_ar=None if ar_ref is None else sum(
                                     np.array_equal(v["final"][b][0], ar_ref[b][0]) for b in range(len(prompts))))
res["mismatch_within_method"] = mismatch
ars = {n: x["ms"] for n, x in res["variants"].items() if n.startswith("ar")}
best_ar = min(ars.values()) if ars else None
for name, x in res["variants"].items():
    extra = f"  {best_ar / x['ms']:.2f}x best ar" if best_ar and not name.startswith("ar") else ""
    print(f"{tag} {name:14s} {x['ms']:8.1f} ms  tau {x['tau']:.3f}  steps {x['steps']} / {x['device_steps']}  "
          f"equal to ar {x['prompts_equal_to_ar']}{extra}", flush=True)
json.dump(res, open(os.path.join(out, f"graphs_{tag}.json"), "w"), indent=1)
print(tag, "mismatches within a method:", mismatch)
assert not mismatch
