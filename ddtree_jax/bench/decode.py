"""A whole decode's wall time against its device work (experiments/decode_timeline.py): per point
the host loops and the device loop interleaved on the same prompts, every loop's tokens checked
(against each other and ar's) before anything is timed, then one traced decode per loop."""

from __future__ import annotations

import tempfile
import time

import jax
import numpy as np

from ddtree_jax import engine
from ddtree_jax.bench import parity, timing

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


def _check_loops(finals: dict, loops, batches: int) -> None:
    """Every loop must emit the same tokens (finals: (loop, batch) -> `_final`)."""
    first = loops[0]
    for loop in loops[1:]:
        for b in range(batches):
            for field in ("out_len", "out_tokens", "accept"):
                if not np.array_equal(finals[(loop, b)][field], finals[(first, b)][field]):
                    raise AssertionError(f"{loop} loop's {field} differs from the {first} "
                                         f"loop's in batch {b}")


def run_point(target, drafter, prompts, method: str, budget: int, streams: int, k: int,
              greedy: dict, *, loops=("paced", "unpaced"), num_batches: int = 1, max_new_tokens: int = 128,
              drafter_attn_impl: str = "auto", reps: int = 15, handoff: str = "load", gap_us: float = 20.0,
              graph_launches: bool = False) -> dict:
    """One point (experiments/decode_timeline.py's docstring; its flags of the same names); greedy:
    streams -> ar's tokens per batch, per stream (filled by an ar point, or here by an untimed
    engine.generate) that this point's tokens are checked against before it is timed.
    graph_launches: each loop's traced decode also split per graph launch (`timing.graph_launches`:
    XLA records a step's body as one CUDA graph, so a launch is a loop iteration)."""
    batches = prompt_batches(prompts, streams, num_batches)
    # One cache size for every batch, so one compiled step serves them all.
    kw = dict(method=method, budget=max(budget, 1), max_new_tokens=max_new_tokens,
              drafter_attn_impl=drafter_attn_impl)
    sus = [engine.setup(target, drafter, b, **kw) for b in batches]
    max_len = max(su.max_len for su in sus)
    sus = [engine.setup(target, drafter, b, max_len=max_len, **kw) for b in batches]
    su = sus[0]
    tparams, dparams = target[1], drafter[1] if su.plan.dcfg is not None else None
    prefilled = [engine.prefill(target, drafter, x) for x in sus]
    steps = {}   # loop -> the compiled call it dispatches
    for loop in loops:
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
        for loop in loops:
            dispatch = []
            finals[(loop, b)] = _final(decode(loop, jax.block_until_ready(steps[loop].load(pre)))[1])
    _check_loops(finals, loops, len(batches))
    tokens = [[row[:n].tolist() for row, n in zip(finals[(loops[0], b)]["out_tokens"],
                                                  finals[(loops[0], b)]["out_len"])]
              for b in range(len(batches))]
    if method == "ar":
        greedy[streams] = tokens
    else:
        if streams not in greedy:
            greedy[streams] = [engine.generate(target, drafter, batch, method="ar", stage_reps=0,
                                               max_new_tokens=max_new_tokens).tokens
                               for batch in batches]
        for b, batch in enumerate(batches):
            parity.check_greedy(target, batch, greedy[streams][b], tokens[b],
                                f"{method}{'@' + str(budget) if method == 'ddtree' else ''} at {streams} "
                                f"streams, k={k}, batch {b}")

    walls = {loop: [[] for _ in batches] for loop in loops}
    dispatches = {loop: [] for loop in loops}
    for _ in range(reps):
        for b, pre in enumerate(prefilled):
            for loop in loops:
                dispatch = []
                if handoff == "prefill":   # the prefill writes into the call's buffers
                    start = engine.prefill(target, drafter, sus[b], into=steps[loop])
                else:
                    start = steps[loop].load(pre)
                wall, state = decode(loop, jax.block_until_ready(start))
                walls[loop][b].append(wall)
                dispatches[loop] += dispatch
                # read now: the loop's next decode reuses this state's buffers (engine.CompiledDecode)
                finals[(loop, b)] = _final(state)
    _check_loops(finals, loops, len(batches))   # the timed decodes too
    first = loops[0]
    out_len = [finals[(first, b)]["out_len"] for b in range(len(batches))]
    accept = [finals[(first, b)]["accept"] for b in range(len(batches))]
    tokens = int(sum(o.sum() - streams for o in out_len))
    flat = np.concatenate([a[a > 0] for a in accept])
    rec = dict(method=method, budget=budget if method == "ddtree" else None, streams=streams,
               steps_per_call=k, batches=len(batches), tokens=tokens,
               steps=int(sum(np.any(a > 0, axis=0).sum() for a in accept)),
               tau=float(flat.mean()))
    for name in loops:
        wall = float(sum(np.median(w) for w in walls[name]))   # the batches' medians, summed
        device_steps = sum(int(finals[(name, b)]["step"]) for b in range(len(batches)))
        fresh = jax.block_until_ready(steps[name].load(prefilled[0]))
        with tempfile.TemporaryDirectory() as d:
            with jax.profiler.trace(d):
                traced_wall, state = decode(name, fresh)
            kernels, _ = timing.device_kernels(d, with_args=graph_launches)
        rec[name] = dict(wall_ms=wall * 1e3, tokens_per_second=tokens / wall,
                         device_steps=device_steps,
                         calls=len(batches) if name.startswith("device") else device_steps // k,
                         dispatch_ms=float(np.median(dispatches[name])) * 1e3,
                         traced_wall_ms=traced_wall * 1e3)
        if kernels:   # the first batch's decode
            t = timing.kernel_timeline(kernels, gap_us)
            rec[name].update(t, host_ms=traced_wall * 1e3 - t["span_ms"])
            if graph_launches:   # a GPU kernel's correlation_id: one per launch, shared by a graph's kernels
                rec[name]["graph_launches"] = timing.graph_launches(
                    [dict(ts=e["ts"], dur=e["dur"], launch=e["args"].get("correlation_id")) for e in kernels])
    return rec
