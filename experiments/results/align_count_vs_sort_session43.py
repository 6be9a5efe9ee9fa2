"""Forms of the routing alignment timed against each other on a GPU (BENCHMARKS.md, issue 4,
session 43): align.py's counting branch (comparison sums, used up to COUNT_MAX_SLOTS slots) and
its sorting branch (a stable argsort), of this checkout's align.py and of other versions of the
file (--align_files, e.g. `git show REV:pallas_kernels/moe/align.py > old.py`), at the K2 routing
(E 384, top-8, 16-row blocks), by device time (profiler) and wall clock. Every form's output is
checked equal to the first's before timing. From the repository root:
  python3 experiments/results/align_count_vs_sort_session43.py --tokens=16,256,520 --align_files=old=old.py"""
import functools
import importlib.util
import os
import sys

sys.path.insert(0, os.getcwd())

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from ddtree_jax import bench_util  # noqa: E402
from pallas_kernels.moe import align  # noqa: E402

flags.DEFINE_list("tokens", ["64", "256", "512", "520", "1040", "2048"], "token counts T (T*8 slots)")
flags.DEFINE_list("align_files", [], "name=path of other align.py versions to time too")
FLAGS = flags.FLAGS


def _module(name: str, path: str):
    spec = importlib.util.spec_from_file_location(f"align_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(_):
    mods = {"head": align, **{n: _module(n, p) for n, p in (kv.split("=", 1) for kv in FLAGS.align_files)}}
    forms = [(f"{n} count", m, 1 << 30) for n, m in mods.items()] + [("head sort", align, 0)]
    print("| T | slots | " + " | ".join(f"{f}: device us | wall us" for f, _, _ in forms) + " |")
    print("|---:|---:|" + "---:|---:|" * len(forms))
    for t in map(int, FLAGS.tokens):
        ids = jnp.argsort(jax.random.uniform(jax.random.key(t), (t, 384)), axis=-1)[:, :8].astype(jnp.int32)
        cells, first = [], None
        for _, mod, limit in forms:
            mod.COUNT_MAX_SLOTS = limit          # read at trace time: one jit per form
            fn = jax.jit(functools.partial(mod.align_routing, num_experts=384, block_m=16))
            out = [np.asarray(a) for a in fn(ids)]
            for a, b in zip(out, first or out):
                np.testing.assert_array_equal(a, b)
            first = first or out
            traced = bench_util.traced_device_time(fn, ids, calls=20)     # None on a CPU
            wall = bench_util.median_seconds(fn, ids, reps=7, inner=20) * 1e6
            cells.append(f"{traced['busy_us'] if traced else float('nan'):.1f} | {wall:.1f}")
        print(f"| {t} | {t * 8} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    app.run(main)
