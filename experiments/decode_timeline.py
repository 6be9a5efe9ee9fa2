"""Where a whole decode's wall time goes: device work, the host's lead before it, idle gaps, tail.

  PYTHONPATH=. python experiments/decode_timeline.py --points=ar:0:1:8,ddtree:64:1:4 \
      --reps=15 --out=$OUT/decode_timeline.json
  PYTHONPATH=. python experiments/decode_timeline.py --points=ar:0:1:8,ddtree:64:1:2 \
      --batches=20 --reps=5 --loops=paced,device --out=$OUT/every_prompt.json   # the goal figure
  PYTHONPATH=. python experiments/decode_timeline.py --dtype=float32 --points=ddtree:8:1:2 \
      --max_new_tokens=16 --reps=2 --loops=paced,device                                 # CPU
  PYTHONPATH=. python experiments/decode_timeline.py --points=ddtree:64:1:4,ar:0:1:8 \
      --loops=paced,unpaced --graph_launches --out=$OUT/graph_launches.json    # per CUDA-graph launch

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
or apart where the float32 target is at a near-tie of its logits or an expert choice), ar's being those of an ar point
of the same streams earlier in --points, else an untimed engine.generate(method="ar"); the timed
decodes must match across loops too. Reported: median wall ms, the steps the device ran, and the median
host time to dispatch one call (the step's launches: when it exceeds the device time of a call,
the host sets the pace). With `--batches` > 1 each point
decodes that many batches of consecutive held-out prompts (one compiled step for all; e.g. every
prompt at 1 stream with --batches=20): tokens, steps and the batches' median walls are summed.
Then one traced decode per loop (the profiler slows the host, so its gaps are an upper bound): device-busy ms (union of kernel
intervals), the device span (first kernel start to last kernel end), idle gaps inside it longer
than `--gap_us`, and traced wall - span (the host's lead before the first kernel plus its tail
after the last). tokens/s = tokens / wall. With --graph_launches each traced decode is also split per
graph launch, i.e. per loop iteration, since XLA records the step's body as one CUDA graph: kernels,
span, busy time, the gaps inside it and before it (medians over the launches of > 20 kernels). On
a CPU backend the trace holds no device streams and only the wall times are reported.
"""

from __future__ import annotations

import json
import os
import time

import jax
import jax.numpy as jnp
from absl import app, flags

from ddtree_jax import progress
import ddtree_jax as dj
from ddtree_jax.atomic_io import write_json
from ddtree_jax.bench import decode, timing
from ddtree_jax.training import data

FLAGS = flags.FLAGS
flags.DEFINE_string("pair_dir", "assets/pair", "target/, drafter/, heldout_prompts.json")
flags.DEFINE_list("points", ["ar:0:1:8", "ddtree:64:1:4"],
                  "method:budget:streams:steps_per_call")
flags.DEFINE_integer("max_new_tokens", 128, "tokens per stream")
flags.DEFINE_integer("batches", 1, "prompt batches per point (streams consecutive "
                     "held-out prompts each, cycling); times and tokens are summed")
flags.DEFINE_integer("reps", 15, "timed decodes per host loop")
flags.DEFINE_float("gap_us", 20.0, "idle intervals longer than this count as gaps")
flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float32"], "pair dtype")
flags.DEFINE_list("loops", ["paced", "unpaced"], f"decode loops from {decode.LOOPS}, interleaved: "
                  "the engine's host loop paced or not, or the whole decode as one call "
                  "(engine._decode_on_device)")
flags.DEFINE_string("drafter_attn_impl", "auto", "the drafter's attention implementation "
                    "(pallas_kernels registry: auto = by backend, xla, pallas_triton)")
flags.DEFINE_enum("handoff", "load", ["load", "prefill"], "how each timed decode's state "
                  "reaches the compiled call's buffers before the timer starts: a copy of the "
                  "batch's prefilled state (CompiledDecode.load), or the prefill run again, "
                  "writing into them (engine.prefill(..., into=))")
flags.DEFINE_bool("graph_launches", False, "also split each loop's traced decode per graph launch "
                  "(XLA records a step's body as one CUDA graph: per launch, i.e. per loop iteration, its "
                  "kernels, span, busy time and the idle gaps inside it and before it; medians over the "
                  "launches of > 20 kernels; GPU)")
flags.DEFINE_string("out", "", "write all points as JSON here")
progress.flag()


def main(argv):
    del argv
    points = [decode.parse_point(p) for p in FLAGS.points]
    if not FLAGS.loops or not set(FLAGS.loops) <= set(decode.LOOPS) or len(set(FLAGS.loops)) < len(FLAGS.loops):
        raise ValueError(f"--loops must name distinct loops from {decode.LOOPS}, got {FLAGS.loops}")
    if FLAGS.batches < 1:
        raise ValueError(f"--batches must be >= 1, got {FLAGS.batches}")
    dtype = jnp.dtype(FLAGS.dtype)
    target = dj.load_target(os.path.join(FLAGS.pair_dir, "target"), dtype=dtype)
    drafter = dj.load_drafter(os.path.join(FLAGS.pair_dir, "drafter"), dtype=dtype)
    prompts = data.load_prompts(os.path.join(FLAGS.pair_dir, "heldout_prompts.json"))
    recs, greedy = [], {}
    for method, budget, streams, k in progress.track(points, "points", FLAGS.progress):
        recs.append(decode.run_point(target, drafter, prompts, method, budget, streams, k, greedy,
                                     loops=FLAGS.loops, num_batches=FLAGS.batches,
                                     max_new_tokens=FLAGS.max_new_tokens,
                                     drafter_attn_impl=FLAGS.drafter_attn_impl, reps=FLAGS.reps,
                                     handoff=FLAGS.handoff, gap_us=FLAGS.gap_us,
                                     graph_launches=FLAGS.graph_launches))
        print(json.dumps(recs[-1]), flush=True)
    if FLAGS.out:
        write_json(FLAGS.out, dict(device=jax.devices()[0].device_kind, jax=jax.__version__,
                                   date=time.strftime("%Y-%m-%d"), drafter_attn_impl=FLAGS.drafter_attn_impl,
                                   handoff=FLAGS.handoff, points=recs), indent=1)
    cols = ["wall_ms", "tokens_per_second", "device_steps", "dispatch_ms", "busy_ms", "span_ms",
            "gaps", "gap_ms", "host_ms"]
    rows, launches = [], []
    for r in recs:
        point = (f"{r['method']}@{r['budget'] or ''} S={r['streams']} k={r['steps_per_call']}"
                 + (f" x{r['batches']} batches" if r["batches"] > 1 else ""))
        for name in FLAGS.loops:
            rows.append(dict(point=point, loop=name, tau=r["tau"], **{c: r[name].get(c) for c in cols}))
            if "graph_launches" in r[name]:
                launches.append(dict(point=point, loop=name, **r[name]["graph_launches"]))
    print(timing.markdown_table(rows, ["point", "loop", "tau"] + cols))
    if launches:
        print(timing.markdown_table(launches, ["point", "loop", "launches", "step_launches", "kernels",
                                               "span_us", "busy_us", "inside_gap_us", "before_us"]))


if __name__ == "__main__":
    app.run(main)
