"""Session 23: what the kernel's epilogue costs in device time. Variants of mosaic_gpu.context_attention
built from its source by replacing the O store line: as is; no O store (lse still written); only the
first of the four 64-column chunks stored (every product's accumulator still read); stores without
the 1/l normalisation; O written in float32 (no conversion to bf16). Kernel alone, device-busy us per call (profiler trace), at the decode shapes.
  PYTHONPATH=$PWD python3 experiments/results/mla_epilogue_probe_h200_session23.py      (H200)"""
import functools
import types
import jax
from ddtree_jax import bench_util, model
from experiments.mla_bench import make_inputs
from pallas_kernels.mla_attention import mosaic_gpu

src = open(mosaic_gpu.__file__).read()
store = "out_at[...] = (acc[:, j * 64:(j + 1) * 64] * inv).astype(o_ref.dtype)"
old = next(line for line in src.splitlines() if line.strip() == store)
pad = old[:len(old) - len(store)]
variants = {"as_is": mosaic_gpu,
            "no_O_store": src.replace(old, pad + "pass"),
            # one 64-column chunk of four: every product's accumulator is still read
            "store_j0": src.replace(old, pad + "if j == 0: " + store),
            "no_normalise": src.replace(old, pad + "out_at[...] = acc[:, j * 64:(j + 1) * 64].astype(o_ref.dtype)"),
            # O (and split parts) in float32: no conversion of the accumulator to bf16
            "f32_out": src.replace("jax.ShapeDtypeStruct((num_s, rows, v_dim), q.dtype)",
                                   "jax.ShapeDtypeStruct((num_s, rows, v_dim), jnp.float32)").replace(
                                   "jax.ShapeDtypeStruct((splits, num_s, rows, v_dim), q.dtype)",
                                   "jax.ShapeDtypeStruct((splits, num_s, rows, v_dim), jnp.float32)"),
            }
for name, v in list(variants.items()):
    if isinstance(v, str):
        mod = types.ModuleType(f"mg_{name}"); mod.__file__ = mosaic_gpu.__file__
        exec(compile(v, mosaic_gpu.__file__, "exec"), mod.__dict__)
        variants[name] = mod
for ctx, nq, ns, splits in ((8192, 1, 1, 64), (8192, 1, 1, 8), (8192, 1, 16, 8), (32768, 1, 16, 8)):
    args = make_inputs(jax.random.key(0), ns, nq, 64, 576, ctx, model.aligned_slots(ctx + nq), 1)[0]
    ops = jax.jit(mosaic_gpu.prepare)(*args)
    line = f"ctx {ctx} Q {nq} S {ns} splits {splits}:"
    for name, mod in variants.items():
        fn = jax.jit(functools.partial(mod.context_attention, scale=0.04, v_dim=512, cluster=1, splits=splits))
        t = bench_util.traced_device_time(fn, *ops, calls=30)
        line += f"  {name} {t['busy_us']:.1f} us"
    print(line, flush=True)
