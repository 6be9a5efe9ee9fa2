"""Where a whole decode's wall time goes: device work, the host's lead before it, idle gaps, tail.

  PYTHONPATH=. python experiments/decode_timeline.py --points=ar:0:1:8,ddtree:64:1:4 \
      --reps=15 --out=$OUT/decode_timeline.json
  PYTHONPATH=. python experiments/decode_timeline.py --dtype=float32 --points=ddtree:8:1:2 \
      --max_new_tokens=16 --reps=2                                                      # CPU

Per point (method:budget:streams:steps_per_call) on the shipped pair and the held-out prompts, as
`engine.generate` decodes them (prefill once, the compiled step, a warm-up call): `--reps` decodes
with the paced host loop (engine.decode, the default) and as many without pacing (dispatching
`max_lag` calls ahead to the end), interleaved so both see the same machine state; median wall ms,
the steps the device ran, and the median host time to dispatch one call (the step's launches: when
it exceeds the device time of a call, the host sets the pace). Then one traced decode per loop
(the profiler slows the host, so its gaps are an upper bound): device-busy ms (union of kernel
intervals), the device span (first kernel start to last kernel end), idle gaps inside it longer
than `--gap_us`, and traced wall - span (the host's lead before the first kernel plus its tail
after the last). tokens/s = tokens / wall. On a CPU backend the trace holds no device streams and only the
wall times are reported.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

import ddtree_jax as dj
from ddtree_jax import bench_util, data, engine

_PAIR = flags.DEFINE_string("pair_dir", "assets/pair", "target/, drafter/, heldout_prompts.json")
_POINTS = flags.DEFINE_list("points", ["ar:0:1:8", "ddtree:64:1:4"],
                            "method:budget:streams:steps_per_call")
_NEW = flags.DEFINE_integer("max_new_tokens", 128, "tokens per stream")
_REPS = flags.DEFINE_integer("reps", 15, "timed decodes per host loop")
_GAP = flags.DEFINE_float("gap_us", 20.0, "idle intervals longer than this count as gaps")
_DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float32"], "pair dtype")
_OUT = flags.DEFINE_string("out", "", "write all points as JSON here")


def parse_point(text: str) -> tuple[str, int, int, int]:
    """"method:budget:streams:steps_per_call" -> its four fields (ValueError naming the point)."""
    parts = text.split(":")
    if len(parts) != 4 or parts[0] not in engine.METHODS or not all(p.isdigit() for p in parts[1:]):
        raise ValueError(f"--points entry {text!r} is not method:budget:streams:steps_per_call "
                         f"with a method in {engine.METHODS}")
    method, budget, streams, k = parts[0], *map(int, parts[1:])
    if streams < 1 or k < 1 or (method == "ddtree" and budget < 1):
        raise ValueError(f"--points entry {text!r}: streams and steps_per_call must be >= 1, and "
                         f"a ddtree budget >= 1")
    return method, budget, streams, k


def run_point(target, drafter, prompts, method: str, budget: int, streams: int, k: int) -> dict:
    batch = [prompts[i % len(prompts)] for i in range(streams)]
    su = engine.setup(target, drafter, batch, method=method, budget=max(budget, 1),
                      max_new_tokens=_NEW.value)
    tparams, dparams = target[1], drafter[1] if su.plan.dcfg is not None else None
    prefilled = engine.prefill(target, drafter, su)
    step = engine._step.lower(tparams, dparams, prefilled, su.plan, k).compile()
    copy = functools.partial(jax.tree_util.tree_map, jnp.copy)
    jax.block_until_ready(step(tparams, dparams, copy(prefilled)))   # warm-up, as generate does

    def timed_step(tp, dp, state):   # engine.decode's call, with the host's time to dispatch it
        t0 = time.perf_counter()
        out = step(tp, dp, state)
        dispatch.append(time.perf_counter() - t0)
        return out

    def decode(pace: bool, state):
        t0 = time.perf_counter()
        state = engine.decode(timed_step, tparams, dparams, state, -(-su.max_steps // k),
                              max_lag=max(1, 3 // k), steps_per_call=k, pace=pace)
        state.out_len.block_until_ready()
        return time.perf_counter() - t0, state

    walls, dispatches = {True: [], False: []}, {True: [], False: []}
    for _ in range(_REPS.value):
        for pace in (True, False):
            dispatch = []
            wall, state = decode(pace, jax.block_until_ready(copy(prefilled)))
            walls[pace].append(wall)
            dispatches[pace] += dispatch
    out_len = np.asarray(state.out_len)
    tokens = int(out_len.sum() - streams)
    accept = np.asarray(state.accept)
    rec = dict(method=method, budget=budget if method == "ddtree" else None, streams=streams,
               steps_per_call=k, tokens=tokens, steps=int(np.any(accept > 0, axis=0).sum()),
               tau=float(accept[accept > 0].mean()))
    for pace in (True, False):
        name = "paced" if pace else "unpaced"
        wall = float(np.median(walls[pace]))
        fresh = jax.block_until_ready(copy(prefilled))
        with tempfile.TemporaryDirectory() as d:
            with jax.profiler.trace(d):
                traced_wall, state = decode(pace, fresh)
            kernels, _ = bench_util.device_kernels(d)
        rec[name] = dict(wall_ms=wall * 1e3, tokens_per_second=tokens / wall,
                         device_steps=int(state.step), calls=int(state.step) // k,
                         dispatch_ms=float(np.median(dispatches[pace])) * 1e3,
                         traced_wall_ms=traced_wall * 1e3)
        if kernels:
            t = bench_util.kernel_timeline(kernels, _GAP.value)
            rec[name].update(t, host_ms=traced_wall * 1e3 - t["span_ms"])
    return rec


def main(argv):
    del argv
    points = [parse_point(p) for p in _POINTS.value]
    dtype = jnp.dtype(_DTYPE.value)
    target = dj.load_target(os.path.join(_PAIR.value, "target"), dtype=dtype)
    drafter = dj.load_drafter(os.path.join(_PAIR.value, "drafter"), dtype=dtype)
    prompts = data.load_prompts(os.path.join(_PAIR.value, "heldout_prompts.json"))
    recs = []
    for method, budget, streams, k in points:
        recs.append(run_point(target, drafter, prompts, method, budget, streams, k))
        print(json.dumps(recs[-1]), flush=True)
    if _OUT.value:
        with open(_OUT.value, "w") as f:
            json.dump(dict(device=jax.devices()[0].device_kind, jax=jax.__version__,
                           date=time.strftime("%Y-%m-%d"), points=recs), f, indent=1)
    cols = ["wall_ms", "tokens_per_second", "device_steps", "dispatch_ms", "busy_ms", "span_ms",
            "gaps", "gap_ms", "host_ms"]
    rows = [dict(point=f"{r['method']}@{r['budget'] or ''} S={r['streams']} k={r['steps_per_call']}",
                 loop=name, tau=r["tau"], **{c: r[name].get(c) for c in cols})
            for r in recs for name in ("paced", "unpaced")]
    print(bench_util.markdown_table(rows, ["point", "loop", "tau"] + cols))


if __name__ == "__main__":
    app.run(main)
