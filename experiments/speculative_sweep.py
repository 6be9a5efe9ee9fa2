"""Speculative decoding sweep: methods ar / dflash / ddtree (+ ddtree-auto) over tree budget x streams
x temperature, on the shipped target + drafter pair (or a random tiny pair); with
config.shared_budgets, ddtree-shared (N draft nodes per step over all streams, at most
config.shared_cap each; + ddtree-shared-auto, N per step) against each N's uniform split.

    python experiments/speculative_sweep.py --config=configs/sweep_default.py
    python experiments/speculative_sweep.py --config=configs/sweep_default.py \
        --config.budgets='(16, 64, 256)' --config.streams='(1, 8)' --config.out_dir=runs/sweep_big

Per point, over every held-out prompt (`batches` 0; or `batches` batches of `streams` prompts):
tau, tokens/s (the median over `timing_reps` repetitions, with the lowest and highest; `steps_per_call` engine steps per
dispatch, or between the device loop's checks; `decode_loop` as engine.generate's, "auto": the
device loop for the speculative methods, the host loop for ar without stop tokens; with
`requests` > 0, `requests` prompts served once through `streams` slots by continuous batching,
ddtree_jax.serving, which takes timing_reps 1 and decode_loop "auto" only), speedup over ar at the
same streams and temperature (ar at its own `ar_steps_per_call` when set: the baseline at its best
dispatch setting), the step-time breakdown (engine stage times), steps, and ddtree_jax.metrics'
acceptance rate by depth, acceptance histogram, TTFT and TPOT percentiles; each record names the
dtype, the matmul precision it ran at (`matmul_precision`, "auto": true float32 for a float32
pair), the commit, library versions and config file (ddtree_jax.bench.sweep). Each finished point is
appended to <out_dir>/results.jsonl (flushed and fsynced); a restart with the same config on the
same JAX backend and device kind skips the points already there. At the end: a summary table on
stdout, <out_dir>/sweep_T<temperature>.png per temperature, and with `results_dir` set the run's
record there (ddtree_jax.bench.record; configs/sweep_h200.py writes it to results/). At
temperature 0 a speculative point's tokens must be ar's (ddtree_jax.bench.parity.check_greedy:
equal, or apart where the float32 target is at a near-tie of its logits or of an expert choice,
counted in "greedy_ties") before its numbers are recorded; ar's records keep their tokens for that
check, in this run and in a resumed one.
ddtree-auto picks its budget per run (ddtree_jax.budget) from the first steps' draft trees and the
step-time curve of the same group's fixed-budget points (measured afresh if there are fewer than 2);
ddtree-shared-auto hands the engine the curve of the group's shared points, and each step picks N.
Every record also holds tokens per step over all streams (and over the steps where every stream
is active), tokens per verified token, tau per stream and each stream's node count per step
(ddtree_jax.bench.sweep.acceptance_stats); with shared points, <out_dir>/shared_T<temperature>.png
compares them with the uniform splits.
"""

from __future__ import annotations

import os
import time

from absl import app, flags
import jax
from ml_collections import config_flags

from ddtree_jax import progress
from ddtree_jax.bench import record, sweep, sweep_io

_DEFAULT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs/sweep_default.py")
_CONFIG = config_flags.DEFINE_config_file("config", _DEFAULT, "sweep config file")
_PROGRESS = progress.flag()


def main(argv):
    del argv
    cfg = _CONFIG.value
    t0 = time.perf_counter()
    if cfg.xla_flags:
        sweep.add_xla_flags(cfg.xla_flags)
    if cfg.compile_cache:     # identical stages of different points (and reruns) compile once
        jax.config.update("jax_compilation_cache_dir", cfg.compile_cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    name = sweep.repo_relative(config_flags.get_config_filename(flags.FLAGS["config"]))
    records = sweep.run_sweep(cfg, config_name=name, show_progress=_PROGRESS.value)
    print(sweep_io.summary_table(records))
    if cfg.results_dir:
        path = record.write_result(cfg.results_dir, {
            **record.run_info("speculative_sweep"), "ceilings": {},
            "config": {k: v for k, v in cfg.to_dict().items() if k not in ("compile_cache",)},
            "rows": [{k: v for k, v in r.items() if k != "tokens"} for r in records]})
        print(f"record: {path}")
    print(f"results: {os.path.join(cfg.out_dir, 'results.jsonl')}; plots: {cfg.out_dir}/sweep_T*.png; "
          f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    app.run(main)
