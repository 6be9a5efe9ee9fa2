"""Tile / stage / warp variants of the raw Triton MoE kernels on the row-pair INT4 layout, timed
against the tuned table in one process, interleaved (BENCHMARKS.md, issue 4, session 43). GPU
only, from the repository root:
  python3 experiments/results/moe_config_sweep_session43.py --tokens=16,64,256 --scale_dtype=float16 \
      --sweep_cfgs='down_stages=2;num_stages=2,down_stages=3;bn_up=32' --pf_rounds=2
Each variant is tuning.config(T) with the fields given (kernel_bench.py --variants syntax); its
output is checked against the xla path before timing."""
import importlib.util
import json
import os
import sys

sys.path.insert(0, os.getcwd())

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from ddtree_jax import bench_util  # noqa: E402
from experiments.kernel_bench import _routings, _time, parse_variants  # noqa: E402
from pallas_kernels.moe import int4, tuning  # noqa: E402
from pallas_kernels.moe.xla import moe_experts_xla  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "pf_probe", os.path.join(os.path.dirname(os.path.abspath(__file__)), "moe_prmt_free_probe_session43.py"))
probe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(probe)         # its flags: --pf_rounds, --pf_out

flags.DEFINE_string("sweep_cfgs", "down_stages=2", "';'-separated MoEConfig overrides")
FLAGS = flags.FLAGS


def main(_):
    saved = os.environ.get("TRITON_CACHE_DIR", "/tmp/th/cache")
    import jax_triton  # noqa: F401
    from pallas_kernels.moe import _triton_kernels
    os.environ["TRITON_CACHE_DIR"] = saved
    ceil = bench_util.measure_ceilings()
    print("ceilings", ceil, flush=True)
    bw = ceil["copy_tbps"] * 1e12
    e, d, i, k = 384, 7168, 2048, 8
    keys = jax.random.split(jax.random.key(1), 8)
    sd = jnp.dtype(FLAGS.scale_dtype)
    ex = {}
    for j, (name, kk, n) in enumerate((("gate", int4.padded_k(d), i), ("up", int4.padded_k(d), i),
                                       ("down", int4.padded_k(i), d))):
        ex[f"{name}_qweight"] = jax.lax.bitcast_convert_type(
            jax.random.bits(keys[2 * j], (e, kk // 8, n), jnp.uint32), jnp.int32)
        ex[f"{name}_qscale"] = jax.random.uniform(keys[2 * j + 1], (e, kk // 32, n), minval=0.004,
                                                  maxval=0.01).astype(jnp.bfloat16).astype(sd)
    fn = probe.moe_fn(_triton_kernels)
    sets = [("base", {})] + [(",".join(f"{a}={b}" for a, b in o.items()), o)
                             for o in parse_variants(FLAGS.sweep_cfgs)]
    expert_bytes = 3 * d * i * (0.5 + 2 / 32)
    rows = []
    for t in map(int, FLAGS.tokens):
        ids_all, w_all, _ = _routings(jax.random.fold_in(keys[7], t), t, e, k, 4)
        ids_all, w_all = [ids_all[r] for r in range(4)], [w_all[r] for r in range(4)]
        xs = [jax.random.normal(jax.random.fold_in(keys[6], 100 * t + r), (t, d), jnp.bfloat16) for r in range(4)]
        active = float(np.mean([np.unique(np.asarray(a)).size for a in ids_all]))
        nbytes = active * expert_bytes + 2 * t * d * 2
        ref = np.asarray(moe_experts_xla(xs[0], ids_all[0], w_all[0], ex).astype(jnp.float32), np.float64)
        cfgs = {}
        for name, o in sets:
            cfg = tuning.config(t)._replace(**o)
            try:
                out = np.asarray(fn(xs[0], ids_all[0], w_all[0], ex, cfg=cfg).astype(jnp.float32), np.float64)
            except Exception as exc:   # a variant Triton rejects: report, go on
                print(f"T={t} {name}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                continue
            err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
            print(f"check T={t} {name}: rel err vs xla {err:.3e}", flush=True)
            if err < 2e-2:
                cfgs[name] = cfg
        for rnd in range(FLAGS.pf_rounds):
            for name, cfg in cfgs.items():
                it = iter(range(1 << 30))
                sec = _time(lambda: (lambda r: fn(xs[r], ids_all[r], w_all[r], ex, cfg=cfg))(next(it) % 4),
                            FLAGS.min_time_s)
                tr = bench_util.traced_device_time(lambda x, a, b, ee: fn(x, a, b, ee, cfg=cfg), xs[0], ids_all[0],
                                                   w_all[0], ex)
                top = {kk["name"]: kk["us"] for kk in tr["top"]}
                row = dict(T=t, variant=name, round=rnd, wall_us=sec * 1e6, device_us=tr["busy_us"],
                           gate_up_us=top.get("gate_up"), down_us=top.get("down"),
                           pct_copy_device=100 * nbytes / (tr["busy_us"] * 1e-6) / bw, scale_dtype=FLAGS.scale_dtype)
                rows.append(row)
                print(json.dumps(row), flush=True)
                if FLAGS.pf_out:
                    with open(FLAGS.pf_out, "a") as fh:
                        fh.write(json.dumps(row) + "\n")
    print(f"\nscale {FLAGS.scale_dtype}; copy {ceil['copy_tbps']:.3f} TB/s; medians over {FLAGS.pf_rounds} rounds")
    print("| T | variant | device us | % copy | gate_up us | down us | wall us |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for t in map(int, FLAGS.tokens):
        for name, _ in sets:
            sel = [r for r in rows if r["T"] == t and r["variant"] == name]
            if not sel:
                continue
            med = lambda key: float(np.median([r[key] for r in sel]))  # noqa: E731
            print(f"| {t} | {name} | {med('device_us'):.1f} | {med('pct_copy_device'):.1f} | {med('gate_up_us'):.1f} | "
                  f"{med('down_us'):.1f} | {med('wall_us'):.1f} |")


if __name__ == "__main__":
    app.run(main)
