"""Issue-4 feasibility probe (session 18): does a Mosaic GPU mixed-type (int8/int4 x bf16) matmul,
JAX's own example kernel jax.experimental.pallas.ops.gpu.hopper_mixed_type_matmul_mgpu (warp
specialised: a TMA producer warpgroup, two consumers converting the weights in registers before
wgmma), stream dense weights [32768, 7168] near the copy bandwidth at decode-size N (16, 64)?
The example accepts only int8; this probe patches its dtype check to also take int4. No group
scales, no routing: an upper bound for a Mosaic GPU W4A16 MoE kernel of this design.

  python3 experiments/results/mgpu_mixed_matmul_h200_session18.py     # on the GPU; on a CPU it
                                                                      # only lowers each config
"""
import functools, inspect, json, os, statistics, time, types
import jax, jax.numpy as jnp
from jax.experimental.pallas.ops.gpu import hopper_mixed_type_matmul_mgpu as mm

CPU = jax.devices()[0].platform == "cpu"
src = inspect.getsource(mm).replace(
    "case (jnp.int8, jnp.bfloat16):",
    "case (jnp.int4, jnp.bfloat16):\n      pass\n    case (jnp.int8, jnp.bfloat16):")
ns = {"__name__": "mmp"}
exec(compile(src, "mmp", "exec"), ns)
if CPU:
  ns["backend"] = types.SimpleNamespace(get_default_device=lambda: types.SimpleNamespace(core_count=132))
TC, MD = ns["TuningConfig"], ns["MatmulDimension"]

M, K = 32768, 7168
def configs(n):
  for tm in (64, 128):
    for tk in (128, 256):
      for st in (4, 8):
        yield TC(tile_m=tm, tile_n=n, tile_k=tk, max_concurrent_steps=st, epi_tile_n=min(n, 64),
                 epi_tile_m=64, wg_dimension=MD.M)

def copy_bw():
  import torch
  x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
  ts = []
  for _ in range(12):
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    s.record(); y.copy_(x); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e) / 1e3)
  return 2 * x.numel() / statistics.median(ts[2:]) / 1e9

def timeit(f, *args):
  for _ in range(3): jax.block_until_ready(f(*args))
  ts = []
  for _ in range(7):
    t0 = time.perf_counter()
    for _ in range(10): out = f(*args)
    jax.block_until_ready(out); ts.append((time.perf_counter() - t0) / 10)
  return statistics.median(ts)

rows = []
bw = None if CPU else copy_bw()
print("copy GB/s", bw, flush=True)
for dt in (jnp.int8, jnp.int4):
  for n in (16, 64):
    if CPU:
      a = jax.ShapeDtypeStruct((M, K), dt); b = jax.ShapeDtypeStruct((K, n), jnp.bfloat16)
    else:
      ka, kb = jax.random.split(jax.random.key(n))
      lo, hi = (-8, 8) if dt == jnp.int4 else (-128, 128)
      a = jax.random.randint(ka, (M, K), lo, hi, dtype=jnp.int8).astype(dt)
      b = jax.random.normal(kb, (K, n), jnp.bfloat16)
      ref = jnp.dot(a.astype(jnp.bfloat16), b, preferred_element_type=jnp.float32)
    nbytes = M * K * (1 if dt == jnp.int8 else 0.5) + K * n * 2 + M * n * 2
    for cfg in configs(n):
      name = f"{jnp.dtype(dt).name} N={n} tm={cfg.tile_m} tk={cfg.tile_k} st={cfg.max_concurrent_steps}"
      f = jax.jit(functools.partial(ns["mixed_matmul_kernel"], out_dtype=jnp.bfloat16, config=cfg))
      try:
        if CPU:
          f.trace(a, b).lower(lowering_platforms=("cuda",)); print("lowered", name, flush=True); continue
        out = f(a, b).astype(jnp.float32)
        err = float(jnp.max(jnp.abs(out - ref)) / jnp.max(jnp.abs(ref)))
        t = timeit(f, a, b)
        r = dict(name=name, us=t * 1e6, gbs=nbytes / t / 1e9, pct=100 * nbytes / t / 1e9 / bw, err=err)
        rows.append(r); print(r, flush=True)
      except Exception as e:
        print("FAIL", name, type(e).__name__, str(e)[:300], flush=True)
out = os.environ.get("OUT")
if out and rows:
  json.dump(dict(copy_gbs=bw, jax=jax.__version__, rows=rows), open(f"{out}/mgpu_probe.json", "w"), indent=1)
print("\n| case | us | GB/s | % copy | err |")
for r in rows: print(f"| {r['name']} | {r['us']:.1f} | {r['gbs']:.0f} | {r['pct']:.1f} | {r['err']:.1e} |")
