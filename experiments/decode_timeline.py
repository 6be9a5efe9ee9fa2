"""Where a whole decode's wall time goes: device work, the host's lead before it, idle gaps, tail.

  PYTHONPATH=. python experiments/decode_timeline.py --points=ar:0:1:8,ddtree:64:1:4 \
      --reps=15 --out=$OUT/decode_timeline.json
  PYTHONPATH=. python experiments/decode_timeline.py --points=ar:0:1:8,ddtree:64:1:2 \
      --batches=20 --reps=5 --loops=paced,device --out=$OUT/every_prompt.json   # the goal figure
  PYTHONPATH=. python experiments/decode_timeline.py --dtype=float32 --points=ddtree:8:1:2 \
      --max_new_tokens=16 --reps=2 --loops=paced,device                                 # CPU

Per point (method:budget:streams:steps_per_call) on the shipped pair and the held-out prompts, as
`engine.generate` decodes them (prefill once, the compiled step, a warm-up call, each decode's
prefilled state loaded into the call's buffers before its timer starts, or with
--handoff=prefill the prefill run again into them): `--reps` decodes
with each of `--loops`, interleaved so all see the same machine state: "paced" is the engine's host
loop (engine.decode as generate runs it with decode_loop="host": for ar without stop tokens,
exactly the known calls and no reads), "unpaced" the same without pacing (dispatching `max_lag`
calls ahead to the end), "device" the whole decode as one call (decode_loop="device", compiled
with engine.DEVICE_LOOP_GRAPHS), "device_xla_graphs" the same call compiled with XLA's default
command buffers. Before any timing, one untimed decode per loop
and batch: every loop must emit the same tokens, and ar's (ddtree_jax.bench.parity.check_greedy: equal,
or apart from a near-tie in the target's logits at bf16 rounding), ar's being those of an ar point
of the same streams earlier in --points, else an untimed engine.generate(method="ar"); the timed
decodes must match across loops too. Reported: median wall ms, the steps the device ran, and the median
host time to dispatch one call (the step's launches: when it exceeds the device time of a call,
the host sets the pace). With `--batches` > 1 each point
decodes that many batches of consecutive held-out prompts (one compiled step for all; e.g. every
prompt at 1 stream with --batches=20): tokens, steps and the batches' median walls are summed.
Then one traced decode per loop (the profiler slows the host, so its gaps are an upper bound): device-busy ms (union of kernel
intervals), the device span (first kernel start to last kernel end), idle gaps inside it longer
than `--gap_us`, and traced wall - span (the host's lead before the first kernel plus its tail
after the last). tokens/s = tokens / wall. On a CPU backend the trace holds no device streams and
only the wall times are reported.
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
from ddtree_jax import engine
from ddtree_jax.bench import timing, parity
from ddtree_jax.training import data

FLAGS = flags.FLAGS
LOOPS = ("paced", "unpaced", "device", "device_xla_graphs")


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


def _final(state) -> dict:
    return {f: np.array(getattr(state, f)) for f in ("out_len", "out_tokens", "accept", "step")}


def _check_loops(finals: dict, batches: int) -> None:
    """Every loop must emit the same tokens (finals: (loop, batch) -> `_final`)."""
    first = FLAGS.loops[0]
    for loop in FLAGS.loops[1:]:
        for b in range(batches):
            for field in ("out_len", "out_tokens", "accept"):
                if not np.array_equal(finals[(loop, b)][field], finals[(first, b)][field]):
                    raise AssertionError(f"{loop} loop's {field} differs from the {first} "
                                         f"loop's in batch {b}")


def run_point(target, drafter, prompts, method: str, budget: int, streams: int, k: int,
              greedy: dict) -> dict:
    """One point; greedy: streams -> ar's tokens per batch, per stream (filled by an ar point, or
    here by an untimed engine.generate) that this point's tokens are checked against before it
    is timed."""
    batches = prompt_batches(prompts, streams, FLAGS.batches)
    # One cache size for every batch, so one compiled step serves them all.
    kw = dict(method=method, budget=max(budget, 1), max_new_tokens=FLAGS.max_new_tokens,
              drafter_attn_impl=FLAGS.drafter_attn_impl)
    sus = [engine.setup(target, drafter, b, **kw) for b in batches]
    max_len = max(su.max_len for su in sus)
    sus = [engine.setup(target, drafter, b, max_len=max_len, **kw) for b in batches]
    su = sus[0]
    tparams, dparams = target[1], drafter[1] if su.plan.dcfg is not None else None
    prefilled = [engine.prefill(target, drafter, x) for x in sus]
    steps = {}   # loop -> the compiled call it dispatches
    for loop in FLAGS.loops:
        if loop.startswith("device"):
            steps[loop] = engine.compile_decode(tparams, dparams, prefilled[0], su, k, "device",
                                                device_graphs=loop == "device")
        else:   # "paced" and "unpaced" dispatch the same compiled step
            steps[loop] = next((steps[x] for x in steps if not x.startswith("device")), None) \
                or engine.compile_decode(tparams, dparams, prefilled[0], su, k, "host")
        jax.block_until_ready(steps[loop](tparams, dparams, engine.copy_tree(prefilled[0])))   # warm-up

    def decode(loop: str, state):   # engine.run_decode, with the host's time to dispatch each call
        def timed_step(tp, dp, s):
            t0 = time.perf_counter()
            out = steps[loop](tp, dp, s)
            dispatch.append(time.perf_counter() - t0)
            return out

        t0 = time.perf_counter()
        state = engine.run_decode(timed_step, tparams, dparams, state, su, k,
                                  "device" if loop.startswith("device") else "host",
                                  pace=loop == "paced")
        state.out_len.block_until_ready()
        return time.perf_counter() - t0, state

    finals = {}   # untimed: every loop's tokens, checked before anything is timed
    for b, pre in enumerate(prefilled):
        for loop in FLAGS.loops:
            dispatch = []
            finals[(loop, b)] = _final(decode(loop, jax.block_until_ready(steps[loop].load(pre)))[1])
    _check_loops(finals, len(batches))
    tokens = [[row[:n].tolist() for row, n in zip(finals[(FLAGS.loops[0], b)]["out_tokens"],
                                                  finals[(FLAGS.loops[0], b)]["out_len"])]
              for b in range(len(batches))]
    if method == "ar":
        greedy[streams] = tokens
    else:
        if streams not in greedy:
            greedy[streams] = [engine.generate(target, drafter, batch, method="ar", stage_reps=0,
                                               max_new_tokens=FLAGS.max_new_tokens).tokens
                               for batch in batches]
        for b, batch in enumerate(batches):
            parity.check_greedy(target, batch, greedy[streams][b], tokens[b],
                                f"{method}{'@' + str(budget) if method == 'ddtree' else ''} at {streams} "
                                f"streams, k={k}, batch {b}")

    walls = {loop: [[] for _ in batches] for loop in FLAGS.loops}
    dispatches = {loop: [] for loop in FLAGS.loops}
    for _ in range(FLAGS.reps):
        for b, pre in enumerate(prefilled):
            for loop in FLAGS.loops:
                dispatch = []
                if FLAGS.handoff == "prefill":   # the prefill writes into the call's buffers
                    start = engine.prefill(target, drafter, sus[b], into=steps[loop])
                else:
                    start = steps[loop].load(pre)
                wall, state = decode(loop, jax.block_until_ready(start))
                walls[loop][b].append(wall)
                dispatches[loop] += dispatch
                # read now: the loop's next decode reuses this state's buffers (engine.CompiledDecode)
                finals[(loop, b)] = _final(state)
    _check_loops(finals, len(batches))   # the timed decodes too
    first = FLAGS.loops[0]
    out_len = [finals[(first, b)]["out_len"] for b in range(len(batches))]
    accept = [finals[(first, b)]["accept"] for b in range(len(batches))]
    tokens = int(sum(o.sum() - streams for o in out_len))
    flat = np.concatenate([a[a > 0] for a in accept])
    rec = dict(method=method, budget=budget if method == "ddtree" else None, streams=streams,
               steps_per_call=k, batches=len(batches), tokens=tokens,
               steps=int(sum(np.any(a > 0, axis=0).sum() for a in accept)),
               tau=float(flat.mean()))
    for name in FLAGS.loops:
        wall = float(sum(np.median(w) for w in walls[name]))   # the batches' medians, summed
        device_steps = sum(int(finals[(name, b)]["step"]) for b in range(len(batches)))
        fresh = jax.block_until_ready(steps[name].load(prefilled[0]))
        with tempfile.TemporaryDirectory() as d:
            with jax.profiler.trace(d):
                traced_wall, state = decode(name, fresh)
            kernels, _ = timing.device_kernels(d)
        rec[name] = dict(wall_ms=wall * 1e3, tokens_per_second=tokens / wall,
                         device_steps=device_steps,
                         calls=len(batches) if name.startswith("device") else device_steps // k,
                         dispatch_ms=float(np.median(dispatches[name])) * 1e3,
                         traced_wall_ms=traced_wall * 1e3)
        if kernels:   # the first batch's decode
            t = timing.kernel_timeline(kernels, FLAGS.gap_us)
            rec[name].update(t, host_ms=traced_wall * 1e3 - t["span_ms"])
    return rec


def main(argv):
    del argv
    points = [parse_point(p) for p in FLAGS.points]
    if not FLAGS.loops or not set(FLAGS.loops) <= set(LOOPS) or len(set(FLAGS.loops)) < len(FLAGS.loops):
        raise ValueError(f"--loops must name distinct loops from {LOOPS}, got {FLAGS.loops}")
    if FLAGS.batches < 1:
        raise ValueError(f"--batches must be >= 1, got {FLAGS.batches}")
    dtype = jnp.dtype(FLAGS.dtype)
    target = dj.load_target(os.path.join(FLAGS.pair_dir, "target"), dtype=dtype)
    drafter = dj.load_drafter(os.path.join(FLAGS.pair_dir, "drafter"), dtype=dtype)
    prompts = data.load_prompts(os.path.join(FLAGS.pair_dir, "heldout_prompts.json"))
    recs, greedy = [], {}
    for method, budget, streams, k in points:
        recs.append(run_point(target, drafter, prompts, method, budget, streams, k, greedy))
        print(json.dumps(recs[-1]), flush=True)
    if FLAGS.out:
        with open(FLAGS.out, "w") as f:
            json.dump(dict(device=jax.devices()[0].device_kind, jax=jax.__version__,
                           date=time.strftime("%Y-%m-%d"), drafter_attn_impl=FLAGS.drafter_attn_impl,
                           handoff=FLAGS.handoff,
                           points=recs), f, indent=1)
    cols = ["wall_ms", "tokens_per_second", "device_steps", "dispatch_ms", "busy_ms", "span_ms",
            "gaps", "gap_ms", "host_ms"]
    rows = [dict(point=f"{r['method']}@{r['budget'] or ''} S={r['streams']} k={r['steps_per_call']}"
                       + (f" x{r['batches']} batches" if r["batches"] > 1 else ""),
                 loop=name, tau=r["tau"], **{c: r[name].get(c) for c in cols})
            for r in recs for name in FLAGS.loops]
    print(timing.markdown_table(rows, ["point", "loop", "tau"] + cols))


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
    flags.DEFINE_list("loops", ["paced", "unpaced"], f"decode loops from {LOOPS}, interleaved: "
                      "the engine's host loop paced or not, or the whole decode as one call "
                      "(engine._decode_on_device)")
    flags.DEFINE_string("drafter_attn_impl", "auto", "the drafter's attention implementation "
                        "(pallas_kernels registry: auto = by backend, xla, pallas_triton)")
    flags.DEFINE_enum("handoff", "load", ["load", "prefill"], "how each timed decode's state "
                      "reaches the compiled call's buffers before the timer starts: a copy of the "
                      "batch's prefilled state (CompiledDecode.load), or the prefill run again, "
                      "writing into them (engine.prefill(..., into=))")
    flags.DEFINE_string("out", "", "write all points as JSON here")


if __name__ == "__main__":
    _define_flags()
    app.run(main)
