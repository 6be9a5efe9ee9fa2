"""Kernel benchmarks on the GPU, one function per operation (--op).

  python3 experiments/kernel_bench.py --op=moe --out_dir=$OUT

--op=moe: routed-expert MoE at the Kimi-K2 layer shape (E=384, d=7168, I=2048, top-8, INT4 group 32)
for each T in --tokens, random routings. Measures in the same run the device-to-device copy bandwidth
(torch copy_) and the bf16 matmul rate (max of torch and XLA); checks every implementation against
the float64 numpy golden on two check tokens before timing it; times the pallas_triton sweep, the
triton kernels, the "xla" path, dequantise-then-ragged_dot and the bf16-weights path. Prints a
table last and writes the run's record (ddtree_jax.bench.record) under --out_dir. --trace adds each timed implementation's
device-busy time per call and its kernels from a profiler trace (the wall-clock time of small calls
can be mostly host dispatch): the % of copy by device time, and for the Pallas and raw Triton
kernels each GEMM kernel's time and % of copy by its own bytes (its experts' weights and scales)
and the rest of the call ("glue": routing alignment, row scaling, combine; `kernel_split`). --scale_dtype=float16 keeps the experts' scales in float16 (the same
values), so the Pallas kernels multiply in float16 (pallas_triton.f16_compute).

The kernels follow the SM clock, which an H200 lowers under its 700 W cap after ~1 s of load
(docs/kernels/moe.md): the wall clock runs after --warm_s of calls (sustained), the
trace's 16 calls come after a pause (a burst), and every row records both windows' SM clock.
--load_s=3 (with --trace) adds a second table from one long trace per row: device time per call in
the first 100 ms (burst; also its first 25 ms, before a heavy call's throttling: T = 1024 is
throttled 30-40 ms in) and after 1 s (sustained), each with its clock and % of copy, headed by
the copy ceiling measured the same way (timing.sustained_copy), whose regimes give a last
column: each regime's % of that copy in the same regime (the xla path's rows say why they have none:
XLA_NO_LOAD):
  python3 experiments/kernel_bench.py --op=moe --sweep=false --trace --load_s=3 \
      --impls=triton,pallas_triton --tokens=1,4,16,64,256,520,1040,2048 --out_dir=$OUT

--budget_s=N starts no new implementation or T after N seconds and still writes the JSON and the
tables, the rest listed as skipped (every implementation at the issue's seven T takes longer than
one 10-minute device call: the xla path alone runs about 80 ms per call at T >= 256).

--impls=variants: the Pallas kernels with the --variants sets on top of the tuned config per T
(without --variants: the tuned config's one-knob neighbours: tiles halved / doubled, a stage
more, twice the warps, swap_ab, split_k at T <= 4), each checked against the golden before timing; and
"parts" rows: the tuned config's routing alignment, gate_up kernel, down kernel and combine timed
alone, in bf16 compute (gate_up and down each include the routing). --impls=triton_variants: the
raw Triton kernels ("auto" on a GPU) with each --variants set (the fields those kernels ignore,
RAW_IGNORED, are refused; without --variants the neighbours that leave those fields alone). One H200 run of the variants against the default:
  python3 experiments/kernel_bench.py --op=moe --impls=pallas_triton,variants --sweep=false \
      --tokens=1,4,16,64,256 --out_dir=$OUT
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from absl import app, flags  # noqa: E402

from ddtree_jax import progress  # noqa: E402
from ddtree_jax.bench import moe, record, timing  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_enum("op", "moe", ["moe"], "operation to benchmark")
flags.DEFINE_string("out_dir", "results", "where the run's record goes (ddtree_jax.bench.record)")
flags.DEFINE_list("tokens", ["1", "4", "16", "64", "256", "1024", "4096"], "token counts T")
flags.DEFINE_list("impls", list(moe.IMPLS[:5]),
                  "implementations / baselines to time (also: variants, triton_variants)")
flags.register_validator("impls", lambda v: set(v) <= set(moe.IMPLS),
                         message=f"--impls takes names from {', '.join(moe.IMPLS)}")
flags.DEFINE_integer("experts", 384, "E")
flags.DEFINE_integer("hidden", 7168, "d")
flags.DEFINE_integer("inter", 2048, "I")
flags.DEFINE_integer("topk", 8, "k")
flags.DEFINE_enum("scale_dtype", "bfloat16", ["bfloat16", "float16"], "the INT4 experts' group scales "
                  "(float16: the Pallas kernels multiply in float16, bf16 activations scaled per row)")
flags.DEFINE_bool("sweep", True, "time the pallas_triton config sweep (else the tuned table only)")
flags.DEFINE_float("min_time_s", 0.15, "time budget per measurement")
timing.define_load_flags("each implementation's device time per call in both regimes, with each "
                             "regime's SM clock and the copy ceiling timed the same way (sustained_copy)")
flags.adopt_module_key_flags(timing)     # --load_s, --idle_s in --helpshort
flags.DEFINE_float("warm_s", 1.0, "seconds of back-to-back calls before each implementation's "
                   "timing, so the GPU's clocks have settled (timing.sustain)")
flags.DEFINE_string("variants", "", "with --impls=variants / triton_variants: option sets applied to the tuned "
                    "config of each T, ';' between sets, ',' between field=value (MoEConfig fields, "
                    "e.g. 'bn_down=256;bn_down=256,down_warps=8'); empty: the tuned config's one-knob neighbours")
flags.DEFINE_float("budget_s", 0, "if > 0, start no new implementation and T once the run has timed for "
                   "this long (seconds): the rest are skipped as rows that say so, and the JSON and tables "
                   "are written (a `timeout` would lose them; the xla path and the bf16-weights path take "
                   "minutes at T >= 256)")
flags.DEFINE_bool("trace", False, "also profile each timed implementation: device-busy time per "
                  "call, the span of the traced calls per call (busy plus idle gaps between kernels) "
                  "and the kernels, over 16 calls after 8 in the same trace (fewer for calls over 12 ms: "
                  "trace_calls; GPU; separates device work from host dispatch)")
progress.flag()


def main(argv):
    del argv
    if {"variants", "triton_variants"} & set(FLAGS.impls):    # bad option sets fail before any device work
        moe.variant_cfgs(1, moe.parse_variants(FLAGS.variants), raw="triton_variants" in FLAGS.impls)
    header = record.run_info(f"kernel_bench_{FLAGS.op}")
    options = moe.Options(tokens=tuple(int(t) for t in FLAGS.tokens), impls=tuple(FLAGS.impls),
                          experts=FLAGS.experts, hidden=FLAGS.hidden, inter=FLAGS.inter, topk=FLAGS.topk,
                          scale_dtype=FLAGS.scale_dtype, sweep=FLAGS.sweep, min_time_s=FLAGS.min_time_s,
                          load_s=FLAGS.load_s, idle_s=FLAGS.idle_s, warm_s=FLAGS.warm_s,
                          variants=FLAGS.variants, budget_s=FLAGS.budget_s, trace=FLAGS.trace,
                          progress=FLAGS.progress)
    res = {"moe": moe.bench_moe}[FLAGS.op](options)
    table = moe.table(res)
    if any("load" in r for r in res["rows"]):
        table += "\n\n" + moe.regimes_table(res)
    extra = {k: v for k, v in res.items() if k not in ("rows", "ceilings", "device", "jax", "triton")}
    path = record.write_result(FLAGS.out_dir, {**header, "ceilings": res["ceilings"], **extra,
                                               "rows": res["rows"]})
    print(json.dumps(res["ceilings"]))
    print(table)
    print(f"wrote {path}")


if __name__ == "__main__":
    app.run(main)
