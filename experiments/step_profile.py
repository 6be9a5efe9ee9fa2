"""Where a decode step's time goes on the device: a profiler trace of the engine's fused step.

  PYTHONPATH=. python experiments/step_profile.py --methods=ar,dflash,ddtree --budgets=16,64 \
      --streams=1,16 --out=$OUT/step_profile.json
  PYTHONPATH=. python experiments/step_profile.py --methods=ddtree --budgets=64 --streams=1,16 \
      --drafter_attn_impl=xla                             # the drafter's attention as XLA ops
  PYTHONPATH=. python experiments/step_profile.py --dtype=float32 --streams=1 --budgets=8 --steps=3  # CPU

Per (method, budget, streams) on the shipped pair and the held-out prompts: prefill, compile the
fused step, then time `--steps` steps under three host loops: "sync" (read the done flag after every
step, waiting for the device), "engine" (engine.decode: read it one step behind) and "async" (never
read it: the host only dispatches); then trace the engine loop with `jax.profiler.trace`. From the trace's device streams:
device-busy time per step (the union of kernel intervals), kernels per step, and the kernels
taking the most device time, and the device time split by source: per engine stage (the named
scopes "draft", "tree", "verify", "accept"), per part (timing.part_of: the verify's attention
core, projections, router, routed and shared experts, norms, lm_head, ...) and per source scope (the kernel's op name stack in the
compiled HLO, cut to --depth segments). busy / wall near 1 means the step is bound by its kernels; well below
1 means the device idles between kernels (launch- or host-bound). On a CPU backend the trace holds
no device streams and only the wall time is reported.
On a GPU the run also measures the copy and matmul ceilings (timing.measure_ceilings) and gives
each verify part its floor at those rates (roofline.verify_part_floors: weight and cache bytes
over the copy bandwidth, FLOPs over the matmul rate) and its % of floor.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

import ddtree_jax as dj
from ddtree_jax import engine, progress
from ddtree_jax.bench import roofline as rf
from ddtree_jax.bench import timing
from ddtree_jax.training import data

_PAIR = flags.DEFINE_string("pair_dir", "assets/pair", "target/, drafter/, heldout_prompts.json")
_METHODS = flags.DEFINE_list("methods", ["ar", "dflash", "ddtree"], "engine methods")
_BUDGETS = flags.DEFINE_list("budgets", ["16", "64"], "ddtree budgets")
_STREAMS = flags.DEFINE_list("streams", ["1", "16"], "concurrent streams")
_STEPS = flags.DEFINE_integer("steps", 20, "steps timed and traced per point")
_TOP = flags.DEFINE_integer("top", 8, "kernels (and source scopes) listed per point")
_DEPTH = flags.DEFINE_integer("depth", 4, "segments of a kernel's source scope it is grouped by, "
                              "e.g. 4: verify/Decoder/layers_*/self_attn")
_DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float32"], "pair dtype")
_DRAFTER_ATTN = flags.DEFINE_string("drafter_attn_impl", "auto", "the drafter's attention "
                                    "implementation (pallas_kernels registry: auto = by backend, xla, pallas_triton)")
_OUT = flags.DEFINE_string("out", "", "write all points as JSON here")
LOOPS = ("sync", "engine", "async")
_PROGRESS = progress.flag()


def _run_steps(step, tparams, dparams, state, n: int, loop: str):
    """n steps (fewer if every stream finishes) with the host loop `loop`: "sync" reads the done
    flag right after each step, "engine" is engine.decode (reads it one step behind), "async"
    never reads it. Returns the state after the device has finished."""
    if loop == "engine":
        return jax.block_until_ready(engine.decode(step, tparams, dparams, state, n))
    for _ in range(n):
        state, left = step(tparams, dparams, state)
        if loop == "sync" and not np.asarray(left).any():
            break
    return jax.block_until_ready(state)


def profile_point(target, drafter, prompts, method: str, budget: int, steps: int, top: int,
                  ceilings: dict | None = None) -> dict:
    su = engine.setup(target, drafter, prompts, method=method, budget=budget,
                      max_new_tokens=steps * (drafter[0].block_size + 1) + 8,
                      drafter_attn_impl=_DRAFTER_ATTN.value)
    dparams = drafter[1] if su.plan.dcfg is not None else None
    state = engine.prefill(target, drafter, su)
    step = engine.decode_steps.lower(target[1], dparams, state, su.plan).compile()
    scopes = timing.hlo_kernel_scopes(step.as_text())
    walls = {}
    for loop in LOOPS:
        state = engine.prefill(target, drafter, su)
        state = _run_steps(step, target[1], dparams, state, 2, "async")          # warm up
        t0 = time.perf_counter()
        state = _run_steps(step, target[1], dparams, state, steps, loop)
        walls[loop] = (time.perf_counter() - t0) / steps * 1e3
    state = engine.prefill(target, drafter, su)
    state = _run_steps(step, target[1], dparams, state, 2, "async")
    ctx = float(np.mean(np.asarray(state.tcache.lengths)))     # the traced steps' context, at their start
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            _run_steps(step, target[1], dparams, state, steps, "engine")
        kernels, procs = timing.device_kernels(d)
    rec = dict(method=method, budget=budget if method == "ddtree" else None, streams=len(prompts),
               steps=steps, **{f"wall_{k}_ms": v for k, v in walls.items()},
               kernels_per_step=len(kernels) / steps)
    if not kernels and jax.default_backend() != "cpu":
        rec["trace_processes"] = procs          # no device streams recognised: say what was there
    if kernels:
        k = timing.kernel_summary(kernels, steps, top)
        rec.update(busy_ms=k["busy_us"] / 1e3, busy_fraction=k["busy_us"] / 1e3 / rec["wall_engine_ms"],
                   top=[dict(name=t["name"], per_step=t["count"], us_per_step=t["us"]) for t in k["top"]],
                   **timing.scope_summary(kernels, steps, scopes, depth=_DEPTH.value, top=_TOP.value))
        if ceilings:   # each verify part against its floor at this run's copy and matmul rates
            floors = rf.verify_part_floors(target[0], len(prompts), su.plan.nodes, int(ctx),
                                           ceilings["copy_tbps"], max(ceilings["matmul_tflops_xla"],
                                                                      ceilings["matmul_tflops_torch"]))
            for part, v in rec["parts"].items():
                if part in floors:
                    v.update(floor_us=floors[part]["floor_us"],
                             pct_floor=100 * floors[part]["floor_us"] / v["us"] if v["us"] else None)
    return rec


def main(argv):
    del argv
    dtype = jnp.dtype(_DTYPE.value)
    target = dj.load_target(os.path.join(_PAIR.value, "target"), dtype=dtype)
    drafter = dj.load_drafter(os.path.join(_PAIR.value, "drafter"), dtype=dtype)
    prompts = data.load_prompts(os.path.join(_PAIR.value, "heldout_prompts.json"))
    points = [(m, int(b)) for m in _METHODS.value
              for b in (_BUDGETS.value if m == "ddtree" else [0])]
    # on a GPU, the copy and matmul ceilings of this run: each verify part's floor
    ceilings = timing.measure_ceilings() if jax.default_backend() == "gpu" else None
    recs = []
    for s in map(int, _STREAMS.value):
        batch = [prompts[i % len(prompts)] for i in range(s)]
        for method, budget in progress.track(points, f"{s} streams", _PROGRESS.value):
            r = profile_point(target, drafter, batch, method, budget, _STEPS.value, _TOP.value, ceilings)
            recs.append(r)
            print(json.dumps(r), flush=True)
    if _OUT.value:
        with open(_OUT.value, "w") as f:
            json.dump(dict(device=jax.devices()[0].device_kind, jax=jax.__version__,
                           date=time.strftime("%Y-%m-%d"), drafter_attn_impl=_DRAFTER_ATTN.value,
                           ceilings=ceilings, points=recs), f, indent=1)
    print("\n| streams | method | budget | ms/step: sync loop | engine loop | async | device-busy ms/step "
          "| busy/engine | kernels/step |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in recs:
        print(f"| {r['streams']} | {r['method']} | {r['budget'] or ''} | {r['wall_sync_ms']:.3f} | "
              f"{r['wall_engine_ms']:.3f} | {r['wall_async_ms']:.3f} | "
              f"{r.get('busy_ms', float('nan')):.3f} | {r.get('busy_fraction', float('nan')):.2f} | "
              f"{r['kernels_per_step']:.0f} |")
    for r in recs:
        if "stages" not in r:
            continue
        print(f"\n{r['method']} {r['budget'] or ''} S={r['streams']}: device time per step by stage "
              f"(engine named scopes), by part (timing.part_of: the verify's attention core, "
              f"projections, router, routed and shared experts, norms, lm_head, ...) and by source scope")
        print("| stage, part or scope | kernels/step | us/step | floor us | % of floor |\n|---|---:|---:|---:|---:|")
        for name, v in sorted(r["stages"].items(), key=lambda kv: -kv[1]["us"]):
            print(f"| **{name}** | {v['kernels']:.1f} | {v['us']:.1f} |  |  |")
        for name, v in sorted(r["parts"].items(), key=lambda kv: -kv[1]["us"]):
            floor = f"{v['floor_us']:.1f} | {v['pct_floor']:.0f}" if v.get("pct_floor") else " | "
            print(f"| *{name}* | {v['kernels']:.1f} | {v['us']:.1f} | {floor} |")
        for v in r["scopes"]:
            print(f"| {v['scope']} | {v['kernels']:.1f} | {v['us']:.1f} |  |  |")


if __name__ == "__main__":
    app.run(main)
