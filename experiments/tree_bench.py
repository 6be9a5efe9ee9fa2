"""Benchmark build_tree (on-device DDTree) against the reference way (GPU top-k + a heap per stream).

    PYTHONPATH=. python experiments/tree_bench.py --streams=16 --budgets=256 --dtype=bfloat16  # the goal
    PYTHONPATH=. python experiments/tree_bench.py --peak=12  # a confident drafter: deeper trees
    PYTHONPATH=. python experiments/tree_bench.py --dtype=bfloat16  # bf16 logits, read as they are
    PYTHONPATH=. python experiments/tree_bench.py --vocab=4096 --budgets=16,64 --streams=1,2  # CPU

First checks, on the benchmark's own inputs: the Pallas top-k equals jax.lax.top_k, and build_tree
through each implementation equals build_tree through the others. Then times, per (streams S,
budget B) and implementation ("xla" or "pallas_triton", the same for every part):
  - top-k + lse: the vocabulary top-K (K = min(B, V)) + logsumexp of the S*L rows;
  - search:      the per-depth search from those (`pallas_kernels.tree_search.stages`' first half);
  - assemble:    from the search's state to the tree fields (the second half);
  - build_tree:  the whole of it, one jitted call (about the sum of the three parts);
  - reference:   jax.lax.top_k + log-softmax values on the device, copied to the host, then the
                 literal heap search per stream (ddtree_jax.reference.tree_ref.search_reference).
The search stops at the first depth with no prefix that can still enter the tree, so its time
depends on the tree's depth (printed with the checks): N(0, scale^2) logits give shallow trees,
--peak gives deep ones.
Device time of an on-device stage, on a GPU: the busy time per call (union of kernel intervals)
in a profiler trace of --reps back-to-back calls, which leaves out the host's dispatch (~56 us on
an H200); build_tree's kernels are printed too. On a CPU (no device trace): (t(n) - t(1)) / (n - 1),
where t(n) is the median wall time of one jitted call running the stage on n distinct inputs back to
back (an earlier version used this on the GPU too: at tens of microseconds it read 1.5-2.5x the
trace). The reference is host wall time.
Draft logits are random normal * --logit_scale, plus --peak on one random token per (stream,
depth) (not real drafter logits).
"""

from __future__ import annotations

import functools
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from ddtree_jax import progress
from ddtree_jax.bench import timing
from ddtree_jax.bench import record
from ddtree_jax import tree as T
from ddtree_jax.reference import tree_ref
from pallas_kernels import registry, topk, tree_search  # noqa: F401  (registering)
from pallas_kernels.topk import pallas_triton as topk_pallas
from pallas_kernels.tree_search import pallas_triton as search_pallas

FLAGS = flags.FLAGS
flags.DEFINE_list("budgets", ["64", "256", "1024"], "tree budgets")
flags.DEFINE_list("streams", ["1", "16"], "stream counts S")
flags.DEFINE_integer("depth", 15, "draft depth L")
flags.DEFINE_integer("vocab", 163840, "vocabulary V")
flags.DEFINE_float("logit_scale", 3.0, "draft logits ~ N(0, scale^2)")
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"],
                  "draft logits dtype (a bf16 lm_head's output is bf16; read as is)")
flags.DEFINE_float("peak", 0.0, "added to one random token's logit per (stream, depth)")
flags.DEFINE_list("impls", ["xla", "pallas_triton"], "kernel implementations to time")
flags.DEFINE_list("select_config", [], "Pallas top-k kernel sizes, SelectConfig fields in order "
                  "(group_cap, elem_cap, rank_pairs, warps, group, chunk, chunk_warps); "
                  "empty: the default")
flags.DEFINE_integer("search_warps", 0, "warps of the Pallas search kernel; 0: the default")
flags.DEFINE_integer("search_cols", 0, "columns of the Pallas search kernel's ranking tile; "
                     "0: the default")
flags.DEFINE_integer("n", 4, "inputs per timed call (device time from t(n) - t(1))")
flags.DEFINE_integer("reps", 15, "timed repetitions (median)")
flags.DEFINE_integer("ref_reps", 3, "repetitions of the host reference (median)")
flags.DEFINE_string("out_dir", "results", "where the run's record goes (ddtree_jax.bench.record)")
progress.flag()


def _median_wall(fn, *args, reps: int) -> float:
    jax.block_until_ready(fn(*args))  # compile + warm up
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _device_time(stage, xs, reps: int) -> float:
    """Seconds per stage call on the device: the busy time of its kernels in a profiler trace
    (GPU), else (t(n) - t(1)) / (n - 1) of wall times over the distinct inputs xs (CPU)."""
    traced = timing.traced_device_time(jax.jit(stage), xs[0], calls=reps)
    if traced:
        return traced["busy_us"] * 1e-6
    many = jax.jit(lambda xs: [stage(x) for x in xs])
    one = jax.jit(lambda xs: [stage(xs[0])])
    t_n = _median_wall(many, xs, reps=reps)
    t_1 = _median_wall(one, xs, reps=reps)
    return max(t_n - t_1, 0.0) / (len(xs) - 1)


def _logits(key, S: int, L: int, V: int):
    k1, k2 = jax.random.split(key)
    x = FLAGS.logit_scale * jax.random.normal(k1, (S, L, V), jnp.float32)
    hot = jax.random.randint(k2, (S, L, 1), 0, V)
    return (x + FLAGS.peak * (jnp.arange(V) == hot)).astype(FLAGS.dtype)


def _part_times(impl: str, xs, budget: int):
    """Device seconds of (top-k + lse, search, assemble) of `impl`, each on its own inputs."""
    S, L, V = xs[0].shape
    K = min(budget, V)
    topk_fn = registry.get("topk_logsumexp", impl)
    search, assemble = tree_search.stages(impl)

    def top(x):
        v, i, lse = topk_fn(x.reshape(S * L, V), K)
        return v.reshape(S, L, K), i.reshape(S, L, K), lse.reshape(S, L)

    tops = [jax.jit(top)(x) for x in xs]
    states = [jax.jit(search, static_argnums=3)(*t, budget) for t in tops]
    num_nodes = tree_search.num_real_nodes(L, V, budget)
    return (_device_time(top, xs, FLAGS.reps),
            _device_time(lambda t: search(*t, budget), tops, FLAGS.reps),
            _device_time(lambda st: assemble(st, num_nodes), states, FLAGS.reps))


def _reference(x, budget: int):
    """The DDTree reference's way: device top-k, host heap per stream. Returns parents, tokens."""
    S, L, V = x.shape
    K = min(budget, V)
    vals, idx = jax.device_get(_ref_topk(x, K))
    out = tree_ref.search_reference(vals, budget)  # heap over each depth's sorted top-K log-probs
    rows = np.arange(S)[:, None]
    depth = np.maximum(out["depths"] - 1, 0)
    # search_reference's tokens index the top-K list; map them back to vocabulary ids.
    return out["parents"], idx[rows, depth, out["tokens"]]


@functools.partial(jax.jit, static_argnums=1)
def _ref_topk(x, K):
    """Device part of the reference: per-depth top-K log-probs [S, L, K] and token ids."""
    S, L, V = x.shape
    x = x.astype(jnp.float32)
    v, i = jax.lax.top_k(x.reshape(S * L, V), K)
    lse = jax.nn.logsumexp(x.reshape(S * L, V), axis=-1)
    return (v - lse[:, None]).reshape(S, L, K), i.reshape(S, L, K)


def main(_):
    if FLAGS.select_config:
        topk_pallas.SELECT = topk_pallas.SelectConfig(*map(int, FLAGS.select_config))
    if FLAGS.search_cols:
        search_pallas.SEARCH_COLS = FLAGS.search_cols
    if FLAGS.search_warps:
        search_pallas.SEARCH_WARPS = FLAGS.search_warps
    L, V = FLAGS.depth, FLAGS.vocab
    dev = jax.devices()[0]
    header = (f"device: {dev.device_kind} ({jax.default_backend()}); jax {jax.__version__}; "
              f"python {platform.python_version()}; L={L}, V={V}, logits N(0,{FLAGS.logit_scale}^2)"
              f" + peak {FLAGS.peak} in {FLAGS.dtype}, n={FLAGS.n}, reps={FLAGS.reps}; "
              f"{topk_pallas.SELECT}, search tile columns {search_pallas.SEARCH_COLS}, warps "
              f"{search_pallas.SEARCH_WARPS}")
    print(header, flush=True)
    run = record.run_info("tree_bench")
    rows = []
    key = jax.random.key(0)
    for S in map(int, FLAGS.streams):
        xs = [_logits(k, S, L, V) for k in jax.random.split(jax.random.fold_in(key, S), FLAGS.n)]
        for B in progress.track([int(b) for b in FLAGS.budgets], f"S={S}", FLAGS.progress):
            K = min(B, V)
            flat = xs[0].reshape(S * L, V)
            # Correctness on the benchmark inputs.
            want_v, want_i = jax.lax.top_k(flat.astype(jnp.float32), K)
            trees = {}
            for impl in FLAGS.impls:
                v, i, _ = registry.get("topk_logsumexp", impl)(flat, K)
                same = bool(jnp.array_equal(i, want_i)) and bool(jnp.array_equal(v, want_v))
                trees[impl] = T.build_tree(xs[0], B, topk_impl=impl)
                print(f"S={S} B={B} {impl}: top-k == lax.top_k: {same}", flush=True)
                if not same:
                    raise SystemExit(f"top-k mismatch for {impl}")
            t0 = trees[FLAGS.impls[0]]
            for impl, t in trees.items():
                for f in ("tokens", "parents", "visibility", "node_mask"):
                    if not bool(jnp.array_equal(getattr(t, f), getattr(t0, f))):
                        raise SystemExit(f"build_tree({impl}).{f} differs")
            ref_par, ref_tok = _reference(xs[0], B)
            agree = float(np.mean(np.asarray(t0.tokens) == ref_tok))
            print(f"S={S} B={B}: build_tree tokens == host reference: {agree:.4f} "
                  f"(parents equal: {np.array_equal(np.asarray(t0.parents), ref_par)}); tree depth "
                  f"max {int(jnp.max(t0.depths))}, mean {float(jnp.mean(t0.depths)):.2f}",
                  flush=True)
            # Timing.
            for impl in FLAGS.impls:
                parts = _part_times(impl, xs, B)
                build = lambda x: T._build(x, B, impl, False)  # noqa: E731
                traced = timing.traced_device_time(jax.jit(build), xs[0], calls=FLAGS.reps)
                t_build = (traced["busy_us"] * 1e-6 if traced
                           else _device_time(build, xs, FLAGS.reps))
                t_call = _median_wall(build, xs[0], reps=FLAGS.reps)
                rows.append((S, B, impl, *parts, t_build, t_call))
                print(f"S={S} B={B} {impl}: top-k + lse {parts[0]*1e6:.1f}, search "
                      f"{parts[1]*1e6:.1f}, assemble {parts[2]*1e6:.1f}, build_tree "
                      f"{t_build*1e6:.1f} us device, {t_call*1e6:.1f} us per single call",
                      flush=True)
                if traced:
                    print(f"S={S} B={B} {impl}: trace {traced['busy_us']:.1f} us busy per call, "
                          f"{traced['kernels']:.0f} kernels: " + ", ".join(
                              f"{k['name']} {k['us']:.1f}" for k in traced["top"]), flush=True)
            times = []
            for _ in range(FLAGS.ref_reps + 1):
                t1 = time.perf_counter()
                _reference(xs[0], B)
                times.append(time.perf_counter() - t1)
            t_ref = statistics.median(times[1:])
            rows.append((S, B, "reference", None, None, None, None, t_ref))
            print(f"S={S} B={B} reference: {t_ref*1e6:.1f} us per call", flush=True)
    fmt = lambda t: "" if t is None else f"{t * 1e6:.1f}"  # noqa: E731
    table = ["| S | budget | impl | top-k + lse | search | assemble | build_tree "
             "| one call, wall |", "|---|---|---|---|---|---|---|---|"]
    table += [f"| {S} | {B} | {impl} | " + " | ".join(map(fmt, times)) + " |"
              for S, B, impl, *times in rows]
    how = ("profiler trace: busy time of the call's kernels" if jax.default_backend() == "gpu"
           else f"(t({FLAGS.n}) - t(1)) / {FLAGS.n - 1} of wall times")
    text = (header + f"\n\nDevice time per call in us ({how}; one call: host wall time in us)."
            "\n\n"
            + "\n".join(table) + "\n")
    print(text)
    us = lambda t: None if t is None else t * 1e6  # noqa: E731
    keys = ("topk_us", "search_us", "assemble_us", "build_us", "call_us")
    path = record.write_result(FLAGS.out_dir, {
        **run, "ceilings": {}, "auto_impl": registry.resolve("topk_logsumexp", "auto"),
        "depth": L, "vocab": V, "dtype": FLAGS.dtype, "logit_scale": FLAGS.logit_scale, "peak": FLAGS.peak,
        "rows": [dict(S=S, budget=B, impl=impl, **({"reference_us": us(times[-1])} if impl == "reference"
                                                   else dict(zip(keys, map(us, times)))))
                 for S, B, impl, *times in rows]})
    print(f"wrote {path}")


if __name__ == "__main__":
    app.run(main)
