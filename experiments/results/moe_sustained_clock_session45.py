"""The MoE op's device time over a few seconds of sustained back-to-back calls, beside the SM clock
and power nvidia-smi reports meanwhile (BENCHMARKS.md, issue 4, session 45). GPU only, from the
repository root:
  python3 experiments/results/moe_sustained_clock_session45.py --tokens=16,64,256 --scale_dtype=bfloat16
Per T: the raw Triton op with the tuned config ("auto" on a GPU), checked against the xla path;
then, after `--idle_s` of idle GPU, `--load_s` of calls cycling 4 routings inside one profiler
trace. Each call's kernels (the trace's kernels in start order, a fixed count per call) give its
device busy time; calls are binned by their start (`--bin_ms` after the first kernel) and each bin
shows the median per-call device time, its % of copy, and the SM clock / power sampled in it
(bench_util.GpuClocks, 50 ms). The last second's wall clock per call (host time between two
waits / calls between them) is printed beside the same calls' device time."""
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
from pallas_kernels.moe import tuning  # noqa: E402
from pallas_kernels.moe.xla import moe_experts_xla  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "pf_probe", os.path.join(os.path.dirname(os.path.abspath(__file__)), "moe_prmt_free_probe_session43.py"))
probe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(probe)         # random_experts, token_inputs, setup_gpu; its flags: --tokens, --scale_dtype

FLAGS = flags.FLAGS
# --idle_s (idle seconds before each T's loaded period) and --load_s (seconds of back-to-back calls,
# traced) are kernel_bench's (imported by the probe; bench_util.define_load_flags), 3 s here
FLAGS.set_default("load_s", 3.0)
flags.DEFINE_integer("bin_ms", 100, "bin width")
flags.DEFINE_string("out", "", "JSON here")


def main(_):
    ceil = probe.setup_gpu()
    bw = ceil["copy_tbps"] * 1e12
    from pallas_kernels.moe.triton_impl import moe_experts_triton
    ex = probe.random_experts(jnp.dtype(FLAGS.scale_dtype))
    report = {"ceilings": ceil, "scale_dtype": FLAGS.scale_dtype, "jax": jax.__version__, "rows": []}
    with bench_util.GpuClocks(interval_ms=50) as clocks:
        for t in map(int, FLAGS.tokens):
            cfg = tuning.config(t)
            inputs, nbytes = probe.token_inputs(t)
            fn = lambda x, ids, w, cfg=cfg: moe_experts_triton(x, ids, w, ex, cfg=cfg)  # noqa: E731 (jitted)
            ref = np.asarray(moe_experts_xla(*inputs[0], ex).astype(jnp.float32), np.float64)
            got = np.asarray(fn(*inputs[0]).astype(jnp.float32), np.float64)
            err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
            print(f"T={t}: rel err vs xla {err:.2e}", flush=True)
            if not err < 2e-2:
                raise AssertionError(f"T={t}: rel err {err:.3e}")
            for r in range(4):
                jax.block_until_ready(fn(*inputs[r]))
            time.sleep(FLAGS.idle_s)
            h0, n, waits, kernels = bench_util.loaded_trace(fn, inputs, FLAGS.load_s)
            calls = bench_util.calls_busy(kernels, n)       # (start us after the first, busy us)
            late = [w for w in waits if w[0] >= waits[-1][0] - 1.0]
            wall_us = (late[-1][0] - late[0][0]) / (late[-1][1] - late[0][1]) * 1e6
            late_dev = float(np.median([b for _, b in calls[late[0][1]:late[-1][1]]]))
            bins = []
            for b0 in range(0, int(FLAGS.load_s * 1000) + FLAGS.bin_ms, FLAGS.bin_ms):
                sel = [b for s, b in calls if b0 * 1e3 <= s < (b0 + FLAGS.bin_ms) * 1e3]
                if not sel:
                    continue
                med = float(np.median(sel))
                clk = clocks.window(h0 + b0 / 1e3, h0 + (b0 + FLAGS.bin_ms) / 1e3)
                bins.append(dict(t_ms=b0, calls=len(sel), device_us=med, pct_copy=100 * nbytes / (med * 1e-6) / bw,
                                 sm_mhz=clk.get("sm_mhz"), power_w=clk.get("power_w_max"),
                                 power_capped=clk.get("power_capped")))
            row = dict(T=t, calls=n, rel_err=err, bytes=nbytes, bins=bins, last_s_wall_us=wall_us,
                       last_s_device_us=late_dev, last_s_wall_pct_copy=100 * nbytes / (wall_us * 1e-6) / bw,
                       last_s_device_pct_copy=100 * nbytes / (late_dev * 1e-6) / bw)
            report["rows"].append(row)
            print(json.dumps(row), flush=True)
    if FLAGS.out:
        with open(FLAGS.out, "w") as f:
            json.dump(report, f, indent=1)
    print(f"\nscale {FLAGS.scale_dtype}; copy {ceil['copy_tbps']:.3f} TB/s")
    print("| T | ms into the load | calls | device us / call (median) | % copy | SM MHz | power W (smi) | capped |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in report["rows"]:
        for b in row["bins"]:
            if b["t_ms"] in (0, 100, 200, 300, 500, 1000, 2000) or b is row["bins"][-1]:
                mhz = f"{b['sm_mhz']:.0f}" if b["sm_mhz"] else "-"
                pw = f"{b['power_w']:.0f}" if b["power_w"] else "-"
                cap = f"{b['power_capped']:.2f}" if b["power_capped"] is not None else "-"
                print(f"| {row['T']} | {b['t_ms']} | {b['calls']} | {b['device_us']:.1f} | {b['pct_copy']:.1f} | "
                      f"{mhz} | {pw} | {cap} |")
    print("\n| T | last second: wall us / call | device us / call | wall % copy | device % copy |")
    print("|---:|---:|---:|---:|---:|")
    for row in report["rows"]:
        print(f"| {row['T']} | {row['last_s_wall_us']:.1f} | {row['last_s_device_us']:.1f} | "
              f"{row['last_s_wall_pct_copy']:.1f} | {row['last_s_device_pct_copy']:.1f} |")


if __name__ == "__main__":
    app.run(main)
