"""Tile / stage / warp variants of the raw Triton MoE op against the tuned table, in a burst and
under sustained load (BENCHMARKS.md, issue 4, session 45). GPU only, from the repository root:
  python3 experiments/results/moe_config_sweep_sustained_session45.py --tokens=16,64,256 \\
      --scale_dtype=bfloat16 --sweep_cfgs='down_stages=2;down_warps=8' --rounds=2
Each variant is tuning.config(T) with the fields given (kernel_bench.py --variants syntax), checked
against the xla path first. Per round, T and variant (interleaved): `--idle_s` idle, then
`--load_s` of back-to-back calls over 4 routings in one profiler trace
(bench_util.loaded_trace); "burst" is the median per-call device time of the
calls that start in the first 100 ms (SM clock near 1980 MHz), "sustained" of those that start
after 1 s (the H200 at its 700 W cap, clock 1400-1700 MHz)."""
import importlib.util
import json
import os
import sys
import time

sys.path.insert(0, os.getcwd())

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from ddtree_jax import bench_util  # noqa: E402
from experiments.kernel_bench import parse_variants  # noqa: E402
from pallas_kernels.moe import tuning  # noqa: E402
from pallas_kernels.moe.xla import moe_experts_xla  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "sustained", os.path.join(os.path.dirname(os.path.abspath(__file__)), "moe_sustained_clock_session45.py"))
sus = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sus)           # its flags: --idle_s, --load_s, --bin_ms, --out; the probe's

flags.DEFINE_string("sweep_cfgs", "down_stages=2", "';'-separated MoEConfig overrides")
flags.DEFINE_integer("rounds", 2, "interleaved rounds")
FLAGS = flags.FLAGS


def main(_):
    ceil = sus.probe.setup_gpu()
    bw = ceil["copy_tbps"] * 1e12
    from pallas_kernels.moe.triton_impl import moe_experts_triton
    ex = sus.probe.random_experts(jnp.dtype(FLAGS.scale_dtype))
    sets = [("base", {})] + [(",".join(f"{a}={b}" for a, b in o.items()), o) for o in parse_variants(FLAGS.sweep_cfgs)]
    rows = []
    with bench_util.GpuClocks(interval_ms=50) as clocks:
        for t in map(int, FLAGS.tokens):
            inputs, nbytes = sus.probe.token_inputs(t)
            ref = np.asarray(moe_experts_xla(*inputs[0], ex).astype(jnp.float32), np.float64)
            calls = {}
            for name, o in sets:
                cfg = tuning.config(t)._replace(**o)
                fn = lambda x, ids, w, cfg=cfg: moe_experts_triton(x, ids, w, ex, cfg=cfg)  # noqa: E731 (jitted)
                try:
                    got = np.asarray(fn(*inputs[0]).astype(jnp.float32), np.float64)
                except Exception as exc:       # a variant Triton rejects: report, go on
                    print(f"T={t} {name}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                    continue
                err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
                print(f"check T={t} {name}: rel err vs xla {err:.3e}", flush=True)
                if err < 2e-2:
                    for r in range(4):
                        jax.block_until_ready(fn(*inputs[r]))
                    calls[name] = fn
            for rnd in range(FLAGS.rounds):
                for name, fn in calls.items():
                    time.sleep(FLAGS.idle_s)
                    h0, n, _, kernels = bench_util.loaded_trace(fn, inputs, FLAGS.load_s)
                    per = bench_util.calls_busy(kernels, n)     # (start us after the first, busy us)
                    burst = [b for s, b in per if s < 1e5]
                    late = [b for s, b in per if s >= 1e6]
                    row = dict(T=t, variant=name, round=rnd, calls=n, burst_us=float(np.median(burst)),
                               sustained_us=float(np.median(late)),
                               burst_mhz=clocks.window(h0, h0 + 0.1).get("sm_mhz"),
                               sustained_mhz=clocks.window(h0 + 1.0, h0 + FLAGS.load_s).get("sm_mhz"))
                    for k in ("burst", "sustained"):
                        row[f"{k}_pct_copy"] = 100 * nbytes / (row[f"{k}_us"] * 1e-6) / bw
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    if FLAGS.out:
        with open(FLAGS.out, "w") as f:
            json.dump({"ceilings": ceil, "scale_dtype": FLAGS.scale_dtype, "rows": rows}, f, indent=1)
    print(f"\nscale {FLAGS.scale_dtype}; copy {ceil['copy_tbps']:.3f} TB/s; medians over {FLAGS.rounds} rounds")
    print("| T | variant | burst us | % copy | SM MHz | sustained us | % copy | SM MHz |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for t in map(int, FLAGS.tokens):
        for name, _ in sets:
            sel = [r for r in rows if r["T"] == t and r["variant"] == name]
            if not sel:
                continue
            med = lambda key: float(np.median([r[key] for r in sel if r[key] is not None] or [np.nan]))  # noqa: E731
            print(f"| {t} | {name} | {med('burst_us'):.1f} | {med('burst_pct_copy'):.1f} | {med('burst_mhz'):.0f} | "
                  f"{med('sustained_us'):.1f} | {med('sustained_pct_copy'):.1f} | {med('sustained_mhz'):.0f} |")


if __name__ == "__main__":
    app.run(main)
