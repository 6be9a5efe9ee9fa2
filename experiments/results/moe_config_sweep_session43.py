"""Tile / stage / warp variants of the raw Triton MoE kernels on the row-pair INT4 layout, timed
against the tuned table in one process, interleaved (BENCHMARKS.md, issue 4, session 43). GPU
only, from the repository root:
  python3 experiments/results/moe_config_sweep_session43.py --tokens=16,64,256 --scale_dtype=float16 \
      --sweep_cfgs='down_stages=2;num_stages=2,down_stages=3;bn_up=32' --pf_rounds=2
Each variant is tuning.config(T) with the fields given (kernel_bench.py --variants syntax); its
output is checked against the xla path before timing."""
import functools
import importlib.util
import os
import sys

sys.path.insert(0, os.getcwd())

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from experiments.kernel_bench import parse_variants  # noqa: E402
from pallas_kernels.moe import tuning  # noqa: E402
from pallas_kernels.moe.xla import moe_experts_xla  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "pf_probe", os.path.join(os.path.dirname(os.path.abspath(__file__)), "moe_prmt_free_probe_session43.py"))
probe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(probe)         # its flags: --pf_rounds, --pf_out

flags.DEFINE_string("sweep_cfgs", "down_stages=2", "';'-separated MoEConfig overrides")
FLAGS = flags.FLAGS


def main(_):
    ceil = probe.setup_gpu()
    from pallas_kernels.moe import _triton_kernels
    ex = probe.random_experts(jnp.dtype(FLAGS.scale_dtype))
    fn = probe.moe_fn(_triton_kernels)
    sets = [("base", {})] + [(",".join(f"{a}={b}" for a, b in o.items()), o)
                             for o in parse_variants(FLAGS.sweep_cfgs)]
    rows = []
    for t in map(int, FLAGS.tokens):
        inputs, nbytes = probe.token_inputs(t)
        ref = np.asarray(moe_experts_xla(*inputs[0], ex).astype(jnp.float32), np.float64)
        calls = {}
        for name, o in sets:
            cfg = tuning.config(t)._replace(**o)
            call = functools.partial(lambda x, a, b, cfg: fn(x, a, b, ex, cfg=cfg), cfg=cfg)
            try:
                out = np.asarray(call(*inputs[0]).astype(jnp.float32), np.float64)
            except Exception as exc:   # a variant Triton rejects: report, go on
                print(f"T={t} {name}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                continue
            err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
            print(f"check T={t} {name}: rel err vs xla {err:.3e}", flush=True)
            if err < 2e-2:
                calls[name] = call
        probe.time_rounds(t, calls, inputs, nbytes, ceil["copy_tbps"] * 1e12, rows)
    probe.print_table(rows, [name for name, _ in sets], ceil["copy_tbps"])


if __name__ == "__main__":
    app.run(main)
