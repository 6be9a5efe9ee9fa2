"""Where a 1-stream decode's wall time goes: the compiled step alone against the host loops.

  PYTHONPATH=. python experiments/host_loop_probe.py --points=ddtree:64:24:4/8,ar:0:128:8 \
      --out=$OUT/loop_probe.json                                               # H200
  PYTHONPATH=. python experiments/host_loop_probe.py --dtype=float32 --points=ddtree:8:4:2 \
      --max_new_tokens=16 --reps=2 --trace=false                               # CPU

Per point "method:budget:n:k[/k...]" on the shipped pair and held-out prompt `--prompt`, untraced,
median of `--reps` decodes from copies of the prefilled state, in ms and us per device step:
  one call   the compiled step of n steps, dispatched once (no host loop: the device's own pace);
  burst      n/k calls of the k-step step back to back, then one wait (dispatch without reading);
  decode     `engine.decode` with max_lag 1..3, paced and not, and the device steps it ran.
With --trace, one traced decode (engine defaults for k) is split per graph launch, i.e. per loop
iteration, since XLA records the step's body as one CUDA graph: kernels, span, busy time (union of
kernel intervals), the gaps inside it and before it (medians over the launches of > 20 kernels).
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
from ddtree_jax.bench import timing
from ddtree_jax.training import data

FLAGS = flags.FLAGS


def parse_point(text: str) -> tuple[str, int, int, list[int]]:
    """"method:budget:n:k[/k...]" -> (method, budget, n, ks) (ValueError naming the point)."""
    parts = text.split(":")
    ok = len(parts) == 4 and parts[0] in engine.METHODS and parts[1].isdigit() and parts[2].isdigit()
    ks = parts[3].split("/") if ok else []
    if not ok or not ks or not all(k.isdigit() and int(k) >= 1 for k in ks) or int(parts[2]) < 1:
        raise ValueError(f"--points entry {text!r} is not method:budget:n:k[/k...] with a method "
                         f"in {engine.METHODS}, n >= 1 and every k >= 1")
    return parts[0], int(parts[1]), int(parts[2]), [int(k) for k in ks]


def traced_kernels(fn) -> list[dict]:
    """Run fn() under the profiler -> its device kernel events with their launch id."""
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            fn()
        events = timing.device_kernels(d, with_args=True)[0]
    return [dict(ts=e["ts"], dur=e["dur"], launch=e["args"].get("correlation_id")) for e in events]


def run_point(target, drafter, prompt, method: str, budget: int, n: int, ks: list[int], *,
              max_new_tokens: int, reps: int, trace: bool) -> list[dict]:
    """The rows of one point (see the module docstring)."""
    su = engine.setup(target, drafter, [prompt], method=method, budget=max(budget, 1),
                      max_new_tokens=max_new_tokens)
    tp, dp = target[1], drafter[1] if su.plan.dcfg is not None else None
    pre = engine.prefill(target, drafter, su)
    comp = {k: engine.decode_steps.lower(tp, dp, pre, su.plan, k).compile() for k in {n, *ks}}
    for c in comp.values():
        jax.block_until_ready(c(tp, dp, engine.copy_tree(pre)))   # warm-up

    def med(fn) -> tuple[float, engine.EngineState]:
        times = []
        for _ in range(reps):
            state = jax.block_until_ready(engine.copy_tree(pre))
            t0 = time.perf_counter()
            state = fn(state)
            state.out_len.block_until_ready()
            times.append(time.perf_counter() - t0)
        return float(np.median(times)) * 1e3, state

    def loop(k, lag, pace):
        return lambda s: engine.decode(comp[k], tp, dp, s, -(-su.max_steps // k), max_lag=lag,
                                       steps_per_call=k, pace=pace)

    def burst(k):
        def run(s):
            for _ in range(max(1, n // k)):
                s, _ = comp[k](tp, dp, s)
            return s
        return run

    point, rows = f"{method}@{budget}" if method == "ddtree" else method, []

    def row(mode, k, fn):
        ms, state = med(fn)
        steps = int(state.step)
        rows.append(dict(point=point, mode=mode, k=k, ms=ms, device_steps=steps,
                         us_per_step=ms * 1e3 / max(steps, 1)))

    row(f"one call of {n}", n, lambda s: comp[n](tp, dp, s)[0])
    for k in ks:
        row(f"{max(1, n // k)} calls back to back", k, burst(k))
        for lag in (1, 2, 3):
            for pace in (False, True):
                row(f"decode lag {lag}{' paced' if pace else ''}", k, loop(k, lag, pace))
    if trace:
        k = ks[0]
        state = jax.block_until_ready(engine.copy_tree(pre))
        kernels = traced_kernels(lambda: loop(k, max(1, 3 // k), k > 1)(state).out_len
                                 .block_until_ready())
        if kernels:
            rows.append(dict(point=point, mode="traced decode, per graph launch", k=k,
                             **timing.graph_launches(kernels)))
    return rows


def main(argv):
    del argv
    points = [parse_point(p) for p in FLAGS.points]
    dtype = jnp.dtype(FLAGS.dtype)
    target = dj.load_target(os.path.join(FLAGS.pair_dir, "target"), dtype=dtype)
    drafter = dj.load_drafter(os.path.join(FLAGS.pair_dir, "drafter"), dtype=dtype)
    prompts = data.load_prompts(os.path.join(FLAGS.pair_dir, "heldout_prompts.json"))
    rows = []
    for method, budget, n, ks in points:
        rows += run_point(target, drafter, prompts[FLAGS.prompt], method, budget, n, ks,
                          max_new_tokens=FLAGS.max_new_tokens, reps=FLAGS.reps, trace=FLAGS.trace)
    if FLAGS.out:
        with open(FLAGS.out, "w") as f:
            json.dump(dict(device=jax.devices()[0].device_kind, jax=jax.__version__,
                           date=time.strftime("%Y-%m-%d"), prompt=FLAGS.prompt, rows=rows), f,
                      indent=1)
    timed = [r for r in rows if "ms" in r]
    print(timing.markdown_table(timed, ["point", "mode", "k", "ms", "device_steps",
                                            "us_per_step"]))
    traced = [r for r in rows if "ms" not in r]
    if traced:
        print(timing.markdown_table(traced, ["point", "k", "launches", "step_launches",
                                                 "kernels", "span_us", "busy_us", "inside_gap_us",
                                                 "before_us"]))


if __name__ == "__main__":
    # Flags are defined only when run as a script, so tests can import the module next to other
    # experiments that define flags of the same names.
    flags.DEFINE_string("pair_dir", "assets/pair", "target/, drafter/, heldout_prompts.json")
    flags.DEFINE_list("points", ["ddtree:64:24:4/8", "ar:0:128:8"],
                      "method:budget:n:k[/k...] (n = steps of the one-call run)")
    flags.DEFINE_integer("prompt", 0, "held-out prompt decoded")
    flags.DEFINE_integer("max_new_tokens", 128, "tokens to generate")
    flags.DEFINE_integer("reps", 10, "decodes per measurement (median)")
    flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float32"], "pair dtype")
    flags.DEFINE_bool("trace", True, "also split one traced decode per graph launch")
    flags.DEFINE_string("out", "", "write every row as JSON here")
    app.run(main)
