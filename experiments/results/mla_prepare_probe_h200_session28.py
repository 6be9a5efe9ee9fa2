"""Record of session 28's run (log beside it). mosaic_gpu_shifts.py was a git-ignored dev copy
of mosaic_gpu.py with shifts in prepare; it gave no fewer kernels and was not kept.

Session 28 (prepared in session 27): mosaic_gpu.prepare as on main (floor divisions by 128 and 32,
which XLA lowers with selects) against runs/dev/prep/mosaic_gpu_shifts.py (the same with shifts and
masks: every operand is >= 0): are the prepare kernels fewer (main: 2 on the H200, ~1.2 + 1.1 us)?
Outputs checked equal first; device time and kernels per call from the profiler trace.
  PYTHONPATH=$PWD python3 runs/dev/prep/prepare_probe28.py
"""
import importlib.util
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax import bench_util
from ddtree_jax.model import aligned_slots
from experiments.mla_bench import make_inputs
from pallas_kernels.mla_attention import mosaic_gpu

spec = importlib.util.spec_from_file_location("mosaic_gpu_shifts", os.path.join(os.path.dirname(__file__),
                                                                                 "mosaic_gpu_shifts.py"))
shifts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(shifts)


def main():
    rows = []
    for ctx, num_q, num_s in ((8192, 1, 1), (8192, 1, 16), (8192, 16, 1), (32768, 1, 8)):
        args = make_inputs(jax.random.key(ctx + num_q + num_s), num_s, num_q, 64, 576, ctx,
                           aligned_slots(ctx + num_q), 1)[0]
        # ragged lengths too, so the tails differ per stream
        args = (args[0], args[1], jnp.asarray(np.linspace(ctx - 300, ctx, num_s).astype(np.int32)), args[3])
        fns = {"main": jax.jit(mosaic_gpu.prepare), "shifts": jax.jit(shifts.prepare)}
        want = fns["main"](*args)
        got = fns["shifts"](*args)
        for a, b in zip(want, got):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        for name, fn in fns.items():
            t = bench_util.traced_device_time(fn, *args, calls=20)
            rows.append(dict(ctx=ctx, q=num_q, s=num_s, impl=name, device_us=t["busy_us"], kernels=t["kernels"],
                             top=str(t["top"][:3])))
            print(rows[-1], flush=True)
    print(f"device {jax.devices()[0].device_kind}  jax {jax.__version__}")
    print(bench_util.markdown_table(rows, ["ctx", "q", "s", "impl", "device_us", "kernels", "top"]))


if __name__ == "__main__":
    sys.exit(main())
