"""Kimi K2.6 projection: a roofline model of the full DDTree step on 8 GPUs per GPU type
(ddtree_jax.bench.roofline), the best tree budget per hardware, checks against published Kimi K2.6 numbers
on 8 RTX PRO 6000, and (--measure) the k2_slice verify-step time per layer on this machine.

    python experiments/k2_projection.py                                   # projection only (any CPU)
    python experiments/k2_projection.py --tau_jsonl=runs/sweep_default/results.jsonl
    export PYTHONPATH=$PWD; python3 experiments/k2_projection.py --measure --out=$OUT/k2.json  # on the H200
    python experiments/k2_projection.py --measure --preset=tiny --measure_budgets=2,4 \
        --measure_streams=1 --measure_ctx=16                               # CPU smoke run
    python3 experiments/k2_projection.py --measure --measure_streams=8,16 --measure_budgets=16 \
        --measure_ctx=16384 --measure_lengths=uniform,spread --measure_balance=on,off   # attn_balance A/B

--measure times, per (streams, budget, lengths, attn_balance), one jitted target forward over
streams x (budget + 1) tree tokens against `--measure_ctx` contexts (all equal, or spread around it
with the same total; random INT4 experts), and separately the MLA attention
core, the routed-experts kernel and lm_head at the same shapes (on a GPU in device time from a
profiler trace, parts_clock "device"; the forward by the wall clock); "rest" per layer = (forward -
layers x attention - MoE layers x MoE - head) / layers, so it holds the host's gaps too. The
attention and MoE kernels are checked against the xla path before they are timed; on a GPU, each
one's % of its roofline floor uses the copy and matmul ceilings measured in the same run
(timing.measure_ceilings). --measure_scale_dtype=float16 keeps the experts' scales in float16
(the MoE kernels then multiply in float16; docs/kernels/moe.md).
"""

from __future__ import annotations

import dataclasses
import json

from absl import app, flags
import jax
import jax.numpy as jnp

from ddtree_jax import progress
import ddtree_jax as dj
from ddtree_jax.atomic_io import write_json
from ddtree_jax.bench import calibration, projection
from ddtree_jax.bench import roofline as rf
from ddtree_jax.bench import timing
from ddtree_jax.bench.timing import markdown_table

FLAGS = flags.FLAGS
flags.DEFINE_list("gpus", list(rf.GPUS), "GPU types to project")
flags.DEFINE_list("calibrations", list(calibration.NAMES), "kernel efficiency calibrations "
                  "(ddtree_jax.bench.calibration: read from the records in results/)")
flags.DEFINE_list("streams", ["1", "10"], "concurrent streams to project")
flags.DEFINE_integer("ctx", 4096, "context tokens per stream")
flags.DEFINE_string("tau", "", "tau curve 'budget:tau,...' (default: roofline.DEFAULT_TAU)")
flags.DEFINE_string("tau_jsonl", "", "take tau(budget) from sweep results (ddtree, T=0, "
                    "fewest streams)")
flags.DEFINE_bool("measure", False, "time the verify step per layer on this machine")
flags.DEFINE_string("preset", "k2_slice", "model preset for --measure")
flags.DEFINE_list("measure_budgets", ["4", "16", "64", "256"], "budgets for --measure")
flags.DEFINE_list("measure_streams", ["1", "8"], "streams for --measure")
flags.DEFINE_integer("measure_ctx", 4096, "context per stream for --measure")
flags.DEFINE_list("measure_lengths", ["uniform"], "--measure's stream contexts: 'uniform' (all measure_ctx) "
                  "and/or 'spread' (measure_ctx / S to ~2 measure_ctx, the same total)")
flags.DEFINE_list("measure_balance", ["on"], "--measure's attn_balance values ('on', 'off'): the "
                  "attention's hint for ragged contexts, as forward takes it")
flags.DEFINE_enum("measure_scale_dtype", "bfloat16", ["bfloat16", "float16"], "--measure's INT4 expert "
                  "scales (QuantConfig.scale_dtype; float16: the MoE kernels multiply in float16)")
flags.DEFINE_integer("reps", 5, "timed repetitions (median)")
flags.DEFINE_string("out", "", "write everything as JSON here")
progress.flag()


def main(argv):
    del argv
    dep = rf.Deployment.kimi_k2_6(ctx=FLAGS.ctx)
    tau = projection.tau_curve(FLAGS.tau, FLAGS.tau_jsonl)
    result = dict(assumptions=rf.MODEL_ASSUMPTIONS, tau=dict(budgets=tau.budgets, taus=tau.taus),
                  gpus={k: vars(g) for k, g in rf.GPUS.items()},
                  calibrations={k: vars(c) for k, c in calibration.calibrations().items()})
    print(rf.MODEL_ASSUMPTIONS)
    for g in rf.GPUS.values():
        print(f"  {g.name}: {g.source}; effective copy {g.copy_tbs:.2f} TB/s, "
              f"bf16 {g.bf16_tflops:.0f} TFLOP/s")
    for c in calibration.calibrations().values():
        print(f"  calibration {c.name}: {c.source}")
    print(f"tau curve (budget: tau): {dict(zip(tau.budgets, tau.taus))}; context {dep.ctx} tokens/stream\n")
    result["projection"], result["best"] = projection.best_budgets(
        dep, tau, FLAGS.gpus, FLAGS.calibrations, [int(x) for x in FLAGS.streams])
    print("Best budget per hardware (8 GPUs, full K2.6; parts in ms per step):")
    print(markdown_table(result["best"], ["gpu", "calibration", "streams", "budget", "tau",
                                          "tokens_per_second", "ar_tokens_per_second", "speedup_over_ar",
                                          "step_ms", "attention_ms", "moe_ms", "rest_ms", "comm_ms",
                                          "draft_ms", "tree_ms"]))
    checks = projection.published_checks(dep, tau)
    result["published_checks"] = checks
    print("\nAgainst published Kimi K2.6 on 8 RTX PRO 6000 (ratio = model / published):")
    print(markdown_table(checks, ["calibration", "check", "model", "published", "ratio", "why"]))
    if FLAGS.measure:
        cfg = dj.ModelConfig.preset(FLAGS.preset)
        cfg = dataclasses.replace(cfg, quant=dataclasses.replace(cfg.quant, scale_dtype=FLAGS.measure_scale_dtype))
        on_gpu = jax.default_backend() == "gpu"
        ceilings = timing.measure_ceilings() if on_gpu else None
        balances = {"on": True, "off": False}
        if bad := set(FLAGS.measure_balance) - set(balances):
            raise app.UsageError(f"--measure_balance takes 'on' and/or 'off', got {sorted(bad)}")
        rows = projection.measure(cfg, [int(b) for b in FLAGS.measure_budgets],
                                  [int(s) for s in FLAGS.measure_streams], FLAGS.measure_ctx,
                                  jnp.bfloat16 if on_gpu else jnp.float32, FLAGS.reps, ceilings,
                                  lengths=FLAGS.measure_lengths,
                                  balances=[balances[v] for v in FLAGS.measure_balance],
                                  progress=FLAGS.progress)
        result["measured"], result["ceilings"], result["scale_dtype"] = rows, ceilings, cfg.quant.scale_dtype
        if ceilings:
            print(f"\nceilings measured in this run: {json.dumps(ceilings)}")
        print(f"\nMeasured on {jax.devices()[0].device_kind}, preset {FLAGS.preset} "
              f"({cfg.num_hidden_layers} layers, {cfg.quant.format} experts"
              f"{f', {cfg.quant.scale_dtype} scales' if cfg.quant.format == 'int4' else ''}), ms (attention / MoE / "
              f"rest per layer):")
        print(markdown_table(rows, list(rows[0])))
    if FLAGS.out:
        write_json(FLAGS.out, result, indent=1, default=str)


if __name__ == "__main__":
    app.run(main)
