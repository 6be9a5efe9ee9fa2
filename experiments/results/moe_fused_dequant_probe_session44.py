"""Probe (BENCHMARKS.md, issue 4, session 44): the raw Triton MoE kernels with the fused INT4
dequantisation (ptx.asm_source_fused: mask + one fma per two weights, the group scale inside)
against the kernels of 9bef662 (mask | exponent, fma / add, then a multiply by the scale), in one
process. GPU only, from the repository root:
  git show 9bef662:pallas_kernels/moe/_triton_kernels.py > /tmp/kern_base.py
  git show 9bef662:pallas_kernels/moe/ptx.py > /tmp/ptx_base.py
  python3 experiments/results/moe_fused_dequant_probe_session44.py --base_kernels=/tmp/kern_base.py \
      --base_ptx=/tmp/ptx_base.py --tokens=16,64,256 --dtypes=float16,bfloat16 --min_time_s=0.3 --pf_rounds=2
Each variant's output is checked bitwise against base's (the fused forms compute the unfused
product times 2^-M, undone exactly on the float32 sums; the experts' scales, uniform in [0.004,
0.01], lie where that holds for float16 too) and base against the xla path, before timing; the
timing rounds interleave the variants (session 43's probe supplies the harness)."""
import functools
import importlib.util
import os
import sys
import tempfile

sys.path.insert(0, os.getcwd())

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from experiments.results import moe_prmt_free_probe_session43 as p43  # noqa: E402
from pallas_kernels.moe import tuning  # noqa: E402
from pallas_kernels.moe.xla import moe_experts_xla  # noqa: E402

flags.DEFINE_list("dtypes", ["float16", "bfloat16"], "scale dtypes")
flags.DEFINE_string("base_kernels", None, "9bef662's pallas_kernels/moe/_triton_kernels.py")
flags.DEFINE_string("base_ptx", None, "9bef662's pallas_kernels/moe/ptx.py")
FLAGS = flags.FLAGS


def base_module():
    """The 9bef662 kernels, importing their PTX from --base_ptx (written where Triton can read it)."""
    src = open(FLAGS.base_kernels).read().replace(
        "from pallas_kernels.moe.ptx import ASM, ASM_F16, ASM_F16_SCALED, ASM_SCALED",
        open(FLAGS.base_ptx).read().split("from __future__ import annotations")[1])
    path = os.path.join(tempfile.mkdtemp(), "kern_base.py")
    open(path, "w").write(src)
    spec = importlib.util.spec_from_file_location("kern_base", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(_):
    ceil = p43.setup_gpu()
    from pallas_kernels.moe import _triton_kernels as fused_mod
    fns = {"base": p43.moe_fn(base_module()), "fused": p43.moe_fn(fused_mod)}
    for dt in FLAGS.dtypes:
        FLAGS.scale_dtype = dt
        ex = p43.random_experts(jnp.dtype(dt))
        rows = []
        for t in map(int, FLAGS.tokens):
            cfg = tuning.config(t)
            inputs, nbytes = p43.token_inputs(t)
            ref = np.asarray(moe_experts_xla(*inputs[0], ex).astype(jnp.float32), np.float64)
            outs = {}
            for name, fn in fns.items():
                outs[name] = np.asarray(fn(*inputs[0], ex, cfg=cfg).astype(jnp.float32), np.float64)
                err = float(np.linalg.norm(outs[name] - ref) / np.linalg.norm(ref))
                same = None if name == "base" else bool(np.array_equal(outs[name], outs["base"]))
                print(f"check {dt} T={t} {name}: rel err vs xla {err:.3e}, bitwise equal to base: {same}", flush=True)
            if not np.array_equal(outs["fused"], outs["base"]):
                continue                                   # not timed: wrong
            calls = {name: functools.partial(lambda x, a, b, fn: fn(x, a, b, ex, cfg=cfg), fn=fn)
                     for name, fn in fns.items()}
            p43.time_rounds(t, calls, inputs, nbytes, ceil["copy_tbps"] * 1e12, rows)
        p43.print_table(rows, fns, ceil["copy_tbps"])


if __name__ == "__main__":
    flags.mark_flags_as_required(["base_kernels", "base_ptx"])
    app.run(main)
