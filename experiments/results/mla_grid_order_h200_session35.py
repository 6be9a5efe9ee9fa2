"""Session 35 (BENCHMARKS.md issue 5; log beside it): split calls past one wave without balance,
launched rows first (grid (rows, stream, split): every part of row block 0, then row block 1; the
session-34 module, a copy) against parts first (grid (stream, split, rows): each run's row blocks
together, now in mosaic_gpu.py). Device us per call from a profiler trace (10 calls), each order
twice, alternating; both checked against the xla path first. Run (device), the session-34 module
first: git show 4396e38:pallas_kernels/mla_attention/mosaic_gpu.py > runs/dev/mosaic_gpu_rowsfirst.py;
python3 <this file>."""
import sys, time
sys.path[:0] = ["experiments", "runs/dev"]
import jax, numpy as np
from ddtree_jax import bench_util
from ddtree_jax.model import aligned_slots
from pallas_kernels.mla_attention import mosaic_gpu, xla
import mosaic_gpu_rowsfirst as old
from mla_bench import make_inputs

SHAPES = [  # ctx, Q, S, run counts
    (16384, 17, 16, (3, 4, 6, 8)), (16384, 17, 8, (3, 6, 8)),
    (32768, 17, 16, (2, 3, 4, 6)), (8192, 9, 16, (3, 4, 6))]
scale, v_dim, rows = 576 ** -0.5, 512, []
t0 = time.time()
for ctx, nq, ns, counts in SHAPES:
    args = make_inputs(jax.random.key(ctx + nq + ns), ns, nq, 64, 576, ctx, aligned_slots(ctx + nq), 1)[0]
    ref = np.asarray(jax.jit(lambda *a: xla.mla_attention_xla(*a, scale=scale, v_dim=v_dim))(*args), np.float64)
    for n in counts:
        fns = {name: jax.jit(lambda *a, c=c: mosaic_gpu.mla_attention_mosaic(*a, scale=scale, v_dim=v_dim, splits=n,
                                                                             context=c))
               for name, c in (("rows_first", old.context_attention), ("parts_first", mosaic_gpu.context_attention))}
        for name, fn in fns.items():
            out = np.asarray(fn(*args), np.float64)
            err = float(np.abs(out - ref).max() / np.abs(ref).max())
            assert err < 1e-2, (ctx, nq, ns, n, name, err)
        for name in ("rows_first", "parts_first", "rows_first", "parts_first"):
            t = bench_util.traced_device_time(fns[name], *args, calls=10)
            rows.append(dict(ctx=ctx, Q=nq, S=ns, runs=n, ctas=ns * n * (nq * 64 // 64), order=name,
                             device_us=round(t["busy_us"], 1), kernels=t["kernels"]))
            print(rows[-1], f"{time.time() - t0:.0f}s", flush=True)
print(bench_util.markdown_table(rows, ["ctx", "Q", "S", "runs", "ctas", "order", "device_us", "kernels"]))
