"""Where a whole decode's wall time goes: device work, the host's lead before it, idle gaps, tail.

  PYTHONPATH=. python experiments/decode_timeline.py --points=ar:0:1:8,ddtree:64:1:4 \
      --reps=15 --out=$OUT/decode_timeline.json
  PYTHONPATH=. python experiments/decode_timeline.py --points=ar:0:1:8,ddtree:64:1:4 \
      --batches=20 --reps=5 --out=$OUT/every_prompt.json           # each held-out prompt alone
  PYTHONPATH=. python experiments/decode_timeline.py --dtype=float32 --points=ddtree:8:1:2 \
      --max_new_tokens=16 --reps=2                                                      # CPU

Per point (method:budget:streams:steps_per_call) on the shipped pair and the held-out prompts, as
`engine.generate` decodes them (prefill once, the compiled step, a warm-up call): `--reps` decodes
with the paced host loop (engine.decode, the default) and as many without pacing (dispatching
`max_lag` calls ahead to the end), interleaved so both see the same machine state; median wall ms,
the steps the device ran, and the median host time to dispatch one call (the step's launches: when
it exceeds the device time of a call, the host sets the pace). With `--batches` > 1 each point
decodes that many batches of consecutive held-out prompts (one compiled step for all; e.g. every
prompt at 1 stream with --batches=20): tokens, steps and the batches' median walls are summed. Then one traced decode per loop
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

FLAGS = flags.FLAGS


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


def prompt_batches(prompts, streams: int, batches: int) -> list[list]:
    """`batches` batches of `streams` consecutive held-out prompts (cycling), as the sweep takes."""
    return [[prompts[(b * streams + i) % len(prompts)] for i in range(streams)]
            for b in range(batches)]


def run_point(target, drafter, prompts, method: str, budget: int, streams: int, k: int) -> dict:
    batches = prompt_batches(prompts, streams, FLAGS.batches)
    # One cache size for every batch, so one compiled step serves them all.
    sus = [engine.setup(target, drafter, b, method=method, budget=max(budget, 1),
                        max_new_tokens=FLAGS.max_new_tokens) for b in batches]
    max_len = max(su.max_len for su in sus)
    sus = [engine.setup(target, drafter, b, method=method, budget=max(budget, 1),
                        max_new_tokens=FLAGS.max_new_tokens, max_len=max_len) for b in batches]
    su = sus[0]
    tparams, dparams = target[1], drafter[1] if su.plan.dcfg is not None else None
    prefilled = [engine.prefill(target, drafter, x) for x in sus]
    step = engine._step.lower(tparams, dparams, prefilled[0], su.plan, k).compile()
    copy = functools.partial(jax.tree_util.tree_map, jnp.copy)
    jax.block_until_ready(step(tparams, dparams, copy(prefilled[0])))   # warm-up, as generate does

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

    walls = {pace: [[] for _ in batches] for pace in (True, False)}
    dispatches, finals = {True: [], False: []}, {}
    for _ in range(FLAGS.reps):
        for b, pre in enumerate(prefilled):
            for pace in (True, False):
                dispatch = []
                wall, state = decode(pace, jax.block_until_ready(copy(pre)))
                walls[pace][b].append(wall)
                dispatches[pace] += dispatch
                finals[(pace, b)] = state
    out_len = [np.asarray(finals[(True, b)].out_len) for b in range(len(batches))]
    accept = [np.asarray(finals[(True, b)].accept) for b in range(len(batches))]
    tokens = int(sum(o.sum() - streams for o in out_len))
    flat = np.concatenate([a[a > 0] for a in accept])
    rec = dict(method=method, budget=budget if method == "ddtree" else None, streams=streams,
               steps_per_call=k, batches=len(batches), tokens=tokens,
               steps=int(sum(np.any(a > 0, axis=0).sum() for a in accept)),
               tau=float(flat.mean()))
    for pace in (True, False):
        name = "paced" if pace else "unpaced"
        wall = float(sum(np.median(w) for w in walls[pace]))   # the batches' medians, summed
        device_steps = sum(int(finals[(pace, b)].step) for b in range(len(batches)))
        fresh = jax.block_until_ready(copy(prefilled[0]))
        with tempfile.TemporaryDirectory() as d:
            with jax.profiler.trace(d):
                traced_wall, state = decode(pace, fresh)
            kernels, _ = bench_util.device_kernels(d)
        rec[name] = dict(wall_ms=wall * 1e3, tokens_per_second=tokens / wall,
                         device_steps=device_steps, calls=device_steps // k,
                         dispatch_ms=float(np.median(dispatches[pace])) * 1e3,
                         traced_wall_ms=traced_wall * 1e3)
        if kernels:   # the first batch's decode
            t = bench_util.kernel_timeline(kernels, FLAGS.gap_us)
            rec[name].update(t, host_ms=traced_wall * 1e3 - t["span_ms"])
    return rec


def main(argv):
    del argv
    points = [parse_point(p) for p in FLAGS.points]
    if FLAGS.batches < 1:
        raise ValueError(f"--batches must be >= 1, got {FLAGS.batches}")
    dtype = jnp.dtype(FLAGS.dtype)
    target = dj.load_target(os.path.join(FLAGS.pair_dir, "target"), dtype=dtype)
    drafter = dj.load_drafter(os.path.join(FLAGS.pair_dir, "drafter"), dtype=dtype)
    prompts = data.load_prompts(os.path.join(FLAGS.pair_dir, "heldout_prompts.json"))
    recs = []
    for method, budget, streams, k in points:
        recs.append(run_point(target, drafter, prompts, method, budget, streams, k))
        print(json.dumps(recs[-1]), flush=True)
    if FLAGS.out:
        with open(FLAGS.out, "w") as f:
            json.dump(dict(device=jax.devices()[0].device_kind, jax=jax.__version__,
                           date=time.strftime("%Y-%m-%d"), points=recs), f, indent=1)
    cols = ["wall_ms", "tokens_per_second", "device_steps", "dispatch_ms", "busy_ms", "span_ms",
            "gaps", "gap_ms", "host_ms"]
    rows = [dict(point=f"{r['method']}@{r['budget'] or ''} S={r['streams']} k={r['steps_per_call']}"
                       + (f" x{r['batches']} batches" if r["batches"] > 1 else ""),
                 loop=name, tau=r["tau"], **{c: r[name].get(c) for c in cols})
            for r in recs for name in ("paced", "unpaced")]
    print(bench_util.markdown_table(rows, ["point", "loop", "tau"] + cols))


def _define_flags() -> None:
    """The command-line flags (defined only when run as a script, so that importing this module
    for its functions defines none)."""
    flags.DEFINE_string("pair_dir", "assets/pair", "target/, drafter/, heldout_prompts.json")
    flags.DEFINE_list("points", ["ar:0:1:8", "ddtree:64:1:4"],
                      "method:budget:streams:steps_per_call")
    flags.DEFINE_integer("max_new_tokens", 128, "tokens per stream")
    flags.DEFINE_integer("batches", 1, "prompt batches per point (streams consecutive "
                         "held-out prompts each, cycling); times and tokens are summed")
    flags.DEFINE_integer("reps", 15, "timed decodes per host loop")
    flags.DEFINE_float("gap_us", 20.0, "idle intervals longer than this count as gaps")
    flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float32"], "pair dtype")
    flags.DEFINE_string("out", "", "write all points as JSON here")


if __name__ == "__main__":
    _define_flags()
    app.run(main)
