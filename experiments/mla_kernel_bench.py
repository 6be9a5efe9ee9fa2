"""The Mosaic GPU MLA kernel alone (`mosaic_gpu.context_attention`), with ptxas's register report.

  export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
  python3 experiments/mla_kernel_bench.py --out=$OUT/mla_kernel.json
  python3 experiments/mla_kernel_bench.py --shapes=8192:16:16 --dump > $OUT/dump.txt
  python3 experiments/mla_kernel_bench.py --shapes=32768:1:16,8192:16:1 --splits=1,4,8    # decode, 1 stream
  python3 experiments/mla_kernel_bench.py --shapes=8192:1:1,8192:1:16 --splits=8,64 --profile   # phases
  python3 experiments/mla_kernel_bench.py --shapes=8192:1:16 --splits=8 --timeline       # CTA timeline
  python3 experiments/mla_kernel_bench.py --shapes=8192:1:16 --splits=8 --timeline --balance   # the schedule's cost
  python3 experiments/mla_kernel_bench.py --shapes=32768:16:16,8192:256:1 --clusters=auto,4   # cluster size A/B
  python3 experiments/mla_kernel_bench.py --lower_only --profile --timeline    # lowers for CUDA, any CPU

For each (ctx, Q, S), every stream at ctx with a bushy tree of Q nodes, the operands as
`mosaic_gpu.prepare` makes them (ctx // 128 whole key pairs, then the tail pairs under the
tree mask): checks the kernel against its XLA twin on stream 0 (relative error of O, absolute
error of lse), then times it. FLOPs = 2 S R 128 (pairs + tail pairs) (Dk + v_dim), the keys the
kernel walks; bytes = those keys read once + queries + outputs + tail bits; floor = max(bytes /
copy bandwidth, FLOPs / matmul rate) from ceilings measured in the same run
(ddtree_jax.bench.mla_kernel). --heads, --dk and --v_dim as in mla_bench.py, which times the
whole wrapper (prep, kernel, merge) instead.
With --ptxas (the default) Mosaic GPU runs ptxas -v on each kernel as it compiles
(MOSAIC_GPU_DUMP_PTXAS); the benchmark captures that report and records the registers and spill
bytes per shape: spills in this kernel's loop cost up to 1.5x (docs/kernels/mla_attention.md).
--dump also prints the PTX and SASS (MOSAIC_GPU_DUMP_PTX, _SASS; SASS needs nvdisasm in the CUDA
root). Off the GPU, --lower_only lowers the kernel for CUDA and stops.
With --profile each kernel also runs under Mosaic GPU's in-kernel profiler (context_attention's
profile_dir): per warpgroup role and phase (consumers: wait_q, context, tail, epilogue; producer:
loads) the median and max duration over CTAs, and when the CTAs start and end. The profiler
slows this kernel (8k decode S 16: 49 -> 88 us), so its phases are shares, not times. With
--timeline each kernel also runs with context_attention(timeline=True), which only stores
%globaltimer at a few points per CTA (TIMELINE: start, Q ready, loops done, the epilogue's steps,
the producer's last load): per point and phase the spread over CTAs at the kernel's own speed.
"""

from __future__ import annotations

import json
import os

from absl import app, flags
import jax

from ddtree_jax import progress
from ddtree_jax.atomic_io import write_json
from ddtree_jax.bench import mla_kernel, timing

FLAGS = flags.FLAGS
flags.DEFINE_integer("heads", 64, "query heads H")
flags.DEFINE_integer("dk", 576, "latent width (kv_lora + rope)")
flags.DEFINE_integer("v_dim", 512, "value width (kv_lora)")
flags.DEFINE_string("out", "", "write every row as JSON here")
flags.DEFINE_list("shapes", ["8192:16:16", "8192:64:16", "8192:256:16", "32768:64:8"], "ctx:Q:S triples")
flags.DEFINE_list("splits", ["1"], "runs each stream's context is split into (context_attention(splits=)); "
                  "above 1 the time includes combine_splits")
flags.DEFINE_bool("balance", False, "context_attention(balance=True): the split runs shared out by the streams' "
                  "pairs (runs.run_schedule, computed in the kernel; equal contexts here, so the same runs as without), "
                  "or with --splits=1 the streams launched longest first (runs.stream_order; all equal here)")
flags.DEFINE_list("clusters", ["auto"], "CTAs per thread-block cluster (context_attention(cluster=)): auto "
                  "(mosaic_gpu.cluster_size: 2 where the row blocks pair up) or a count dividing the row blocks")
flags.DEFINE_list("epilogues", ["tma"], "how the consumers write O (context_attention(epilogue=)): tma, registers")
flags.DEFINE_bool("ptxas", True, "capture ptxas -v for each kernel: registers and spill bytes per shape")
flags.DEFINE_bool("dump", False, "also print each kernel's PTX and SASS to stdout")
flags.DEFINE_bool("lower_only", False, "lower the kernel for CUDA and stop (runs on a CPU)")
flags.DEFINE_bool("timeline", False, "also run each kernel with context_attention(timeline=True) and report "
                  "when its CTAs pass each TIMELINE point (mla_kernel.timeline_summary): light, unlike --profile")
flags.DEFINE_bool("profile", False, "also run each kernel once under Mosaic GPU's in-kernel profiler and "
                  "report its phases per warpgroup (mla_kernel.profile_phases); with --lower_only, lower that form too")
progress.flag()


def main(_):
    if FLAGS.ptxas or FLAGS.dump:     # read by the compiler at compile time: set before anything compiles
        os.environ["MOSAIC_GPU_DUMP_PTXAS"] = "1"
    if FLAGS.dump:
        os.environ.update(MOSAIC_GPU_DUMP_PTX="1", MOSAIC_GPU_DUMP_SASS="1")
    ceilings = None if FLAGS.lower_only else timing.measure_ceilings()
    if ceilings:
        print(f"ceilings {json.dumps(ceilings)}  device {jax.devices()[0].device_kind}  jax {jax.__version__}")
    rows = mla_kernel.run_kernel_bench(FLAGS.shapes, [int(n) for n in FLAGS.splits], FLAGS.clusters,
                                       FLAGS.epilogues, heads=FLAGS.heads, dk=FLAGS.dk, v_dim=FLAGS.v_dim,
                                       balance=FLAGS.balance, ceilings=ceilings, capture_ptxas=not FLAGS.dump,
                                       lower_only=FLAGS.lower_only, timeline=FLAGS.timeline,
                                       profile=FLAGS.profile, progress=FLAGS.progress)
    if FLAGS.lower_only:
        print("ok")
        return
    if FLAGS.out:
        write_json(FLAGS.out, {"ceilings": ceilings, "rows": rows, "device": jax.devices()[0].device_kind,
                               "jax": jax.__version__}, indent=1)
    print("\n".join(mla_kernel.report_lines(rows)))


if __name__ == "__main__":
    app.run(main)
