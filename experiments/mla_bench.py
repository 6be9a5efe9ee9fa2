"""Benchmark MLA tree-verify attention against its roofline (Kimi-K2 dims by default).

  export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
  python3 experiments/mla_bench.py --ctx=8192,32768 --q=1,16,64,256 --streams=1,8,16 --impls=auto,xla \
      --trace    # the goal's table (BENCHMARKS.md)
  python3 experiments/mla_bench.py --ctx=8192 --q=16,64 --streams=8 --configs=64x64x8x2,32x64x4x2
  python3 experiments/mla_bench.py --ctx=8192,32768,1024 --q=16,64,256,4 --streams=1,16,8 \
      --configs=32x64x4x2,tp128x128x8x3-128x256x64x8x3 --budget_s=400    # one-pass vs two-pass
  python3 experiments/mla_bench.py --ctx=8192 --q=16,64 --streams=16 --impls=pallas_triton --parts \
      --configs=tp128x256x8x3-128x256x64x8x3,tp128x128x8x3-128x256x64x8x3    # each pass alone
  python3 experiments/mla_bench.py --ctx=8192,32768 --q=1,16 --streams=1,16 --impls=mosaic_gpu \
      --parts    # where mosaic_gpu's time goes: XLA prep (query rows, tail words), kernel, combine
  python3 experiments/mla_bench.py --ctx=8192 --q=1 --streams=1,8 --impls=mosaic_gpu,xla --trace \
      --mosaic_splits=16,64    # device time per call and its kernels; mosaic_gpu at other run counts
  python3 experiments/mla_bench.py --ctx=8192 --q=1 --streams=16 --impls=mosaic_gpu --trace \
      --mosaic_decode_words    # decode: the kernel's own tail mask against XLA's per-row words
  python3 experiments/mla_bench.py --ctx=16384 --q=1,16 --streams=8,16 --impls=mosaic_gpu,xla --trace \
      --lengths=uniform,spread --mosaic_balance   # ragged contexts (same total) against uniform ones
  python3 experiments/mla_bench.py --ctx=8192,32768 --q=1,16,64,256 --streams=16,8,1 \
      --impls=mosaic_gpu,xla --trace --load_s=3   # both power regimes (the H200 caps at 700 W)

For each (ctx, Q, S): time of every implementation, FLOPs = 2*S*Q*H*(ctx+Q)*(Dk+v_dim), bytes =
latent cache read once + queries + outputs, the floor max(bytes / copy_bw, FLOPs / matmul_rate)
from ceilings measured in the same run, and % of floor. Pallas outputs are checked against the
xla implementation on every shape (when xla is timed), every implementation against the float64
numpy golden on a small ragged case, and on every shape each pallas config against the golden on a
slice (streams 0 and S-1, heads 0 and H-1, the first 8 tree nodes) before it is timed; a config
that fails a check is reported and not timed. With several configs, a side-by-side table shows each
config's time per shape, the fastest, and its speedup over the first config (the baseline). The
kernel alone, with ptxas's registers, the in-kernel profiler and timeline: mla_kernel_bench.py.

With --load_s each row also gets its device time per call in a burst (the first 100 ms of a load),
in the burst's first 25 ms (before a heavy call's throttle step: 32k Q 16 S 16 ran its first 14
calls 7% faster than the 100 ms median, docs/kernels/mla_attention.md) and under sustained
load (from 1 s on), against floors from the copy and bf16 matmul ceilings
timed under the same load (docs/kernels/moe.md: the SM clock drops under the cap,
and compute-bound shapes and the matmul ceiling follow it): a second table.
"""

from __future__ import annotations

import json

from absl import app, flags
import jax

from ddtree_jax import progress
from ddtree_jax.bench import mla, record, timing
from pallas_kernels.mla_attention import pallas_triton


FLAGS = flags.FLAGS
flags.DEFINE_list("ctx", ["1024", "8192", "32768"], "context lengths")
flags.DEFINE_list("q", ["1", "16", "64", "256"], "new tokens (tree nodes) per stream")
flags.DEFINE_list("streams", ["1", "8", "16"], "streams S")
flags.DEFINE_list("lengths", ["uniform"], "per-stream contexts: 'uniform' (every stream's is ctx) and/or "
                  "'spread' (stream i's is ctx * (2i + 1) / S: the same total as uniform, the longest ~2x ctx)")
flags.DEFINE_integer("heads", 64, "query heads H")
flags.DEFINE_integer("dk", 576, "latent width (kv_lora + rope)")
flags.DEFINE_integer("v_dim", 512, "value width (kv_lora)")
flags.DEFINE_list("configs", ["auto"],
                  "pallas configs: 'auto' (select_config's pick per shape), one-pass "
                  "'BMxBNxWARPSxSTAGES[sSPLITS]' (sN: N context splits, else by occupancy), or two-pass "
                  "'tpMxNxWxS-MxVxKxWxS' (scores GEMM, "
                  "P @ V GEMM); first = baseline")
flags.DEFINE_list("impls", ["pallas_triton", "xla"],
                  "implementations to time: pallas_triton (with --configs), mosaic_gpu, xla, and auto "
                  "(what impl=\"auto\" runs: registry.get(\"mla_attention\", \"auto\"), its shape rule included)")
flags.DEFINE_bool("parts", False, "two-pass configs: also time pass 1 (scores) and pass 2 (P @ V) alone; "
                  "mosaic_gpu: its XLA prep (query rows, tail words), kernel and merge alone (mosaic_parts)")
flags.DEFINE_float("budget_s", 0, "if > 0, start no new shape once the sweep has run this long (seconds)")
flags.DEFINE_bool("in_graph", True, "also time each call inside one jitted program of several calls "
                  "(time_in_graph): without the host's per-call dispatch, as in a model step")
flags.DEFINE_bool("trace", False, "also profile each timed implementation inside one jitted program of "
                  "several calls: device-busy time per call (the union of its kernels' intervals, without "
                  "the host's dispatch, which time_in_graph still divides into small calls) and its top kernels")
flags.DEFINE_list("mosaic_splits", [], "with --impls=mosaic_gpu: also time it with each of these run counts "
                  "per stream (rows 'mosaic_gpu sN'; the default row uses mosaic_gpu.split_count's rule)")
flags.DEFINE_bool("mosaic_balance", False, "with --impls=mosaic_gpu: also time it with balance=True (the split "
                  "runs shared out by the streams' pairs, unsplit calls' streams launched longest first; "
                  "for --lengths=spread)")
flags.DEFINE_list("mosaic_merges", [], "with --impls=mosaic_gpu: also time it with each of these merges of "
                  "the split runs (rows 'mosaic_gpu merge=M'; mosaic_gpu.MERGES; the default row uses 'pallas')")
flags.DEFINE_bool("mosaic_decode_words", False, "with --impls=mosaic_gpu at Q 1: also time it with the tail's "
                  "mask as per-row words made by XLA before the kernel (row 'mosaic_gpu words': the form "
                  "before the decode form) instead of the kernel's decode form")
flags.DEFINE_string("out_dir", "results", "where the run's record goes (ddtree_jax.bench.record); "
                    "empty: none")
flags.DEFINE_float("warm_s", 0.0, "seconds of back-to-back calls before each wall clock "
                   "(timing.sustain): 0 times from an idle GPU's burst, ~1 or more the power-capped "
                   "steady state (each row records its SM clock either way)")
timing.define_load_flags("each row's device time per call in both regimes, each against a floor from "
                             "the copy and bf16 matmul ceilings timed the same way (sustained_copy, _matmul)")
flags.adopt_module_key_flags(timing)     # --load_s, --idle_s in --helpshort
progress.flag()


def main(_):
    with timing.GpuClocks() as clocks:
        _main(clocks)


def _main(clocks):
    configs = {c: None if c == "auto" else pallas_triton.parse_config(c) for c in FLAGS.configs}
    ceilings = timing.measure_ceilings(clocks)
    if FLAGS.load_s > 0:      # both ceilings in the regimes the rows' load profiles report
        load = dict(load_s=FLAGS.load_s, idle_s=FLAGS.idle_s, clocks=clocks)
        ceilings.update(copy_load=timing.sustained_copy(**load), matmul_load=timing.sustained_matmul(**load))
    print(f"ceilings {json.dumps(ceilings)}  device {jax.devices()[0].device_kind}  jax {jax.__version__}")
    golden = mla.golden_check(FLAGS.heads, FLAGS.dk, FLAGS.v_dim, configs, tuple(FLAGS.impls))
    print("golden rel err", json.dumps(golden))

    header = record.run_info("mla_bench")

    def write(rows):     # after every row: a run cut off still leaves its record
        if FLAGS.out_dir:
            record.write_result(FLAGS.out_dir, {**header, "ceilings": ceilings, "golden": golden,
                                                "rows": rows})
    rows = mla.run_mla_bench([int(x) for x in FLAGS.ctx], [int(x) for x in FLAGS.q],
                             [int(x) for x in FLAGS.streams], heads=FLAGS.heads, dk=FLAGS.dk,
                             v_dim=FLAGS.v_dim, configs=configs, impls=tuple(FLAGS.impls), ceilings=ceilings,
                             budget_s=FLAGS.budget_s, parts=FLAGS.parts, in_graph=FLAGS.in_graph,
                             trace=FLAGS.trace, mosaic_splits=[int(n) for n in FLAGS.mosaic_splits],
                             mosaic_merges=FLAGS.mosaic_merges, mosaic_balance=FLAGS.mosaic_balance,
                             mosaic_decode_words=FLAGS.mosaic_decode_words,
                             lengths=tuple(FLAGS.lengths), warm_s=FLAGS.warm_s, clocks=clocks,
                             load_s=FLAGS.load_s, idle_s=FLAGS.idle_s, on_row=write,
                             progress=FLAGS.progress)
    write(rows)
    print(mla.table(rows))
    if any("load" in r for r in rows):
        print(mla.regimes_table(rows, ceilings))
    if len(configs) > 1 and "pallas_triton" in FLAGS.impls:
        print(mla.variants_table(rows, list(configs)))


if __name__ == "__main__":
    app.run(main)
