"""Kimi K2.6 verify step measured sharded over n GPUs, per engine stage and per layer part, next to
the roofline projection.

    # 2 H200s: the first 4 layers (real dims, random INT4 experts), 2-way tensor parallel, then 1-way
    export PYTHONPATH=$PWD; python3 experiments/k2_step_bench.py --layers=4 --devices=2,1 \\
        --time_limit_s=480 --out=$OUT/k2_step.json
    # 8 H200s: docs/k2_8gpu_plan.md (4 layers with the per-layer split, then 61 layers per budget)
    # memory plans only (no devices needed)
    python experiments/k2_step_bench.py --plan_only --devices=8 --layers=61
    # CPU smoke run
    XLA_FLAGS=--xla_force_host_platform_device_count=2 JAX_PLATFORMS=cpu PYTHONPATH=. \\
        python experiments/k2_step_bench.py --preset=tiny --devices=1,2 --budgets=4 --streams=1,2 --reps=2

Model: the first --layers decoder layers of --preset (dims and layer kinds of the full model; INT4
routed experts with --int4) and a DFlash drafter sized by `DrafterConfig.for_target`; random params
drawn leaf by leaf straight into their shards. Per device count n: a mesh of the first n devices
with n along --axis ("tensor": routed experts, heads, MLP width and vocabulary split n ways;
"expert": only the routed experts). Per (n, budget B, streams S), each stream's caches hold
--context tokens (cache slots per stream: context + largest budget + 1, aligned to 8):

  stages  the engine's stage functions, each jitted on its own: draft (engine.stage_draft), tree
          (stage_tree), verify (stage_verify: S (B+1) tokens through every layer, tapping the
          drafter's layers) and accept (stage_accept: walk, emission, cache compaction, drafter
          context). Verify and accept take the state donated, so cache writes happen in place as in
          the fused step; the fused step itself is not timed (one more large compile per point).
  parts   of the verify, jitted on their own with the verify's shapes and shardings: the MLA
          attention core (sharding.attention over "mla_attention"), the routed experts
          (sharding.moe_experts over "moe_experts", tokens routed by the layer's own router, the
          combine's psum included), layer 0's dense MLP and lm_head. rest per layer = (verify -
          layers x attention - MoE layers x MoE - dense layers x dense MLP - head) / layers:
          projections, router, shared expert, norms, all-reduces, embedding. A part timed alone
          lacks the overlap and fusion it gets inside the verify program, so rest is approximate
          and comes out negative when the parts' sum exceeds the verify.
Check: with n > 1, a 1-way run first computes every point's tree and verify logits (untimed, when
the 1-way memory plan fits one --plan_device; else none, said in the output and the JSON); each
n-way verify then runs on that tree, and its logits must match within ddtree_jax.bench.parity.SHARDED_TOL
(relative error 5e-2 in bfloat16, 1e-3 in float32) before the verify, accept and parts are timed.
Timing: median over --reps rounds of --inner back-to-back calls synchronised once per round (the
host's dispatch overlaps the device's work), after one untimed call; compiles are ahead of time
(lower + compile) and timed separately. Verified tokens/s = S (B+1) / verify time. Each timing
also keeps the SM clock and power-cap state of the mesh's GPUs over it (timing.GpuClocks,
nvidia-smi: their samples pooled, with each GPU's median; the point's "clocks", the table's verify
column): the H200 lowers its SM clock under its 700 W cap after about 1 s of heavy load, and
SM-bound work slows with it (docs/kernels/moe.md).

Projection: ddtree_jax.bench.roofline.step_time for the same layer count, n GPUs and context (--gpu,
--calibration); its verify = attention + MoE + rest + comm + head. It models the "tensor" layout
(experts, heads, MLP width and vocabulary split n ways, the latent cache replicated).
Extrapolation to the full preset (computed from the measured parts, not measured): full layers x
(attention + rest) + full MoE layers x MoE + full dense layers x dense MLP + head.
Memory: ddtree_jax.bench.memory_plan for this run on each mesh and for the full preset on --plan_devices
devices; on a GPU, the compiled verify's XLA temp bytes and the allocator's peak are recorded.
"""

from __future__ import annotations

import warnings

import jax
from absl import app, flags

from ddtree_jax import progress
from ddtree_jax import sharding
from ddtree_jax.bench import calibration, k2_step
from ddtree_jax.bench import memory_plan as mp
from ddtree_jax.bench import roofline as rf

FLAGS = flags.FLAGS
_D = k2_step.Options()     # the defaults
flags.DEFINE_string("preset", _D.preset, "ModelConfig preset: the dims, and the full model to "
                    "extrapolate to")
flags.DEFINE_integer("layers", _D.layers, "decoder layers to build, the preset's first N "
                     "(default: min(4, the preset's))")
flags.DEFINE_bool("int4", _D.int4, "INT4 routed experts (group 32) whatever the preset's format")
flags.DEFINE_list("devices", None, "device counts n to measure, in this order (default: every device)")
flags.DEFINE_enum("axis", _D.axis, ["tensor", "expert"], "mesh axis the n devices go on")
flags.DEFINE_list("budgets", list(map(str, _D.budgets)), "tree budgets B (B + 1 verified tokens per "
                  "stream)")
flags.DEFINE_list("streams", list(map(str, _D.streams)), "stream counts S")
flags.DEFINE_integer("context", _D.context, "tokens already in each stream's caches")
flags.DEFINE_integer("reps", _D.reps, "timed rounds per measurement (the median is reported)")
flags.DEFINE_integer("inner", _D.inner, "back-to-back calls per timed round")
flags.DEFINE_bool("parts", _D.parts, "also time the verify's parts (attention, MoE, dense MLP, head)")
flags.DEFINE_enum("dtype", _D.dtype, ["bfloat16", "float32"], "params (but INT4 experts) and caches")
flags.DEFINE_enum("gpu", _D.gpu, list(rf.GPUS), "GPU type of the projection")
flags.DEFINE_enum("calibration", _D.calibration, list(calibration.NAMES),
                  "the projection's kernel efficiencies")
flags.DEFINE_integer("plan_devices", _D.plan_devices, "device count of the full model's memory plan")
flags.DEFINE_enum("plan_device", _D.plan_device, list(mp.DEVICES), "accelerator of the memory plans")
flags.DEFINE_float("time_limit_s", _D.time_limit_s, "start no new point after this many seconds (0: none)")
flags.DEFINE_string("out", _D.out, "write the results as JSON here (rewritten after every point)")
flags.DEFINE_bool("plan_only", _D.plan_only, "print the memory plans (no devices needed) and stop")
sharding.define_distributed_flags()
progress.flag()


def main(argv):
    del argv
    sharding.initialize_from_flags()
    # the donated state's pass-through leaves (PRNG key, counters) cannot all be reused: expected
    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
    f = FLAGS
    ints = k2_step.parse_ints
    k2_step.run(k2_step.Options(
        preset=f.preset, layers=f.layers, int4=f.int4, devices=ints("devices", f.devices or [jax.device_count()]),
        axis=f.axis, budgets=ints("budgets", f.budgets), streams=ints("streams", f.streams), context=f.context,
        reps=f.reps, inner=f.inner, parts=f.parts, dtype=f.dtype, gpu=f.gpu, calibration=f.calibration,
        plan_devices=f.plan_devices, plan_device=f.plan_device, time_limit_s=f.time_limit_s, out=f.out,
        plan_only=f.plan_only, progress=f.progress))


if __name__ == "__main__":
    app.run(main)
