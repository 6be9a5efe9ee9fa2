"""kernel_bench with the raw Triton MoE kernels compiled under a register cap and/or other stage
counts (BENCHMARKS.md, issue 4, session 42). jax-triton's compile options have no maxnreg field, so
this patches them: the cap reaches the PTX as `.maxnreg`. GPU only, from the repository root, e.g.
  MAXNREG="gate_up=96" STAGES="up=2,down=3" python3 experiments/results/moe_maxnreg_probe_session42.py \
      --op=moe --impls=triton --sweep=false --trace --tokens=16,64,256 --scale_dtype=float16
MAXNREG: kernel=registers; STAGES: up= tuning.config's num_stages, down= its down_stages."""
import os, sys, threading
sys.path.insert(0, os.getcwd())
saved = os.environ.get("TRITON_CACHE_DIR", "/tmp/th/cache")
import jax_triton.triton_lib as tl_lib
os.environ["TRITON_CACHE_DIR"] = saved   # jax_triton blanks it on import; do_bench's driver needs one
from triton.backends.nvidia import compiler as nv

caps = dict(kv.split("=") for kv in os.environ.get("MAXNREG", "").split(",") if kv)
stages = dict(kv.split("=") for kv in os.environ.get("STAGES", "").split(",") if kv)
cur = threading.local()
orig_get = tl_lib.get_or_create_triton_kernel
def get(backend_init_func, platform, fn, *a, **kw):
    cur.name = fn.__name__
    return orig_get(backend_init_func, platform, fn, *a, **kw)
tl_lib.get_or_create_triton_kernel = get
orig_parse = nv.CUDABackend.parse_options
def parse(self, opts):
    name = getattr(cur, "name", "")
    if name in caps:
        opts = dict(opts, maxnreg=int(caps[name]))
        print("maxnreg", name, caps[name], flush=True)
    return orig_parse(self, opts)
nv.CUDABackend.parse_options = parse

from pallas_kernels.moe import tuning
orig_cfg = tuning.config
def cfg(t, *a, **kw):
    c = orig_cfg(t, *a, **kw)
    if stages:
        c = c._replace(**{("num_stages" if k == "up" else "down_stages"): int(v) for k, v in stages.items()}) \
            if hasattr(c, "_replace") else __import__("dataclasses").replace(
                c, **{("num_stages" if k == "up" else "down_stages"): int(v) for k, v in stages.items()})
    return c
tuning.config = cfg
import experiments.kernel_bench as kb
from absl import app
app.run(kb.main)
