"""Registers, spills and shared memory of the Pallas:Triton MLA attention kernel, without a GPU.

Lowers `mla_attention_pallas` for the CUDA platform with interpret mode off (Pallas emits Triton
IR; no GPU needed), captures each kernel's TTIR, compiles it for sm_90a with a pip Triton living
in a separate Python (--triton_python; the project's venv has none), and runs ptxas -v on the PTX.
Reports per (config, Q): registers per thread, spill stores/loads (bytes), Triton's shared memory
(bytes), and which MMA the PTX uses (wgmma = Hopper warpgroup MMA, mma = the older mma.sync).
The pip Triton's pipeline is close to, not the same as, the one jaxlib bundles on the GPU.

  python3 -m venv /tmp/tvenv && /tmp/tvenv/bin/pip install triton==3.6.0
  PYTHONPATH=$PWD .venv/bin/python experiments/ptx_stats.py --triton_python=/tmp/tvenv/bin/python \\
      --configs=32x64x4x2,64x32x4x2v2 --q=16,64,256 --streams=8 --ctx=8192
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile


def _compile_worker(manifest_path: str) -> None:
    """Runs under --triton_python: compile each TTIR of the manifest, print one JSON line each."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import compile as triton_compile

    import triton

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    for item in json.load(open(manifest_path)):
        res = {"key": item["key"]}
        try:
            k = triton_compile(item["ttir"], target=GPUTarget("cuda", 90, 32),
                               options={"num_warps": item["num_warps"], "num_stages": item["num_stages"]})
            ptx = k.asm["ptx"]
            with tempfile.TemporaryDirectory() as d:
                open(f"{d}/k.ptx", "w").write(ptx)
                log = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", f"{d}/k.ptx", "-o", f"{d}/k.cubin"],
                                     capture_output=True, text=True, check=True).stderr
            res.update(regs=int(re.search(r"Used (\d+) registers", log).group(1)),
                       spill_st=int(re.search(r"(\d+) bytes spill stores", log).group(1)),
                       spill_ld=int(re.search(r"(\d+) bytes spill loads", log).group(1)),
                       smem=k.metadata.shared, wgmma=ptx.count("wgmma.mma_async"), mma=ptx.count("mma.sync"))
        except Exception as e:  # report and go on: one config failing must not end the table
            res["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:200]}"
        print(json.dumps(res), flush=True)


def dump_ttir(configs, qs, *, num_s, ctx, heads, dk, v_dim, out_dir) -> list[dict]:
    """Lower the kernel for CUDA per (config, Q) and write its TTIR; returns the compile manifest."""
    from unittest import mock

    import jax
    import jax.numpy as jnp
    from jax._src.pallas.triton import pallas_call_registration as reg

    from pallas_kernels.mla_attention import pallas_triton

    modules = []
    lower_module = reg.lowering.lower_jaxpr_to_triton_module

    def capture(*args, **kwargs):
        res = lower_module(*args, **kwargs)
        modules.append(res.module.operation.get_asm(enable_debug_info=False))
        return res

    manifest = []
    with mock.patch.object(pallas_triton, "interpret_mode", lambda: False), \
            mock.patch.object(reg.lowering, "lower_jaxpr_to_triton_module", capture):
        jax.clear_caches()                       # earlier traces were made in interpret mode
        for cfg in configs:
            for num_q in qs:
                specs = (jax.ShapeDtypeStruct((num_s, num_q, heads, dk), jnp.bfloat16),
                         jax.ShapeDtypeStruct((num_s, ctx + num_q, dk), jnp.bfloat16),
                         jax.ShapeDtypeStruct((num_s,), jnp.int32),
                         jax.ShapeDtypeStruct((num_s, num_q, -(-num_q // 32)), jnp.int32))
                fn = lambda *a, cfg=cfg: pallas_triton.mla_attention_pallas(*a, scale=dk ** -0.5, v_dim=v_dim,
                                                                            config=cfg)
                jax.jit(fn).trace(*specs).lower(lowering_platforms=("cuda",))
                key = f"{cfg.name} Q={num_q}"
                path = os.path.join(out_dir, re.sub(r"\W", "_", key) + ".ttir")
                open(path, "w").write(modules[-1])
                splits = cfg.num_splits or pallas_triton.default_splits(
                    num_s, num_q * heads, ctx + num_q, cfg.block_m, cfg.v_split)
                manifest.append(dict(key=key, config=cfg.name, q=num_q, splits=splits, ttir=path,
                                     num_warps=cfg.num_warps, num_stages=cfg.num_stages))
    return manifest


def main(_):
    from absl import flags

    from pallas_kernels.mla_attention.pallas_triton import BlockConfig

    f = flags.FLAGS
    configs = [BlockConfig.parse(c) for c in f.configs]
    with tempfile.TemporaryDirectory() as d:
        manifest = dump_ttir(configs, [int(x) for x in f.q], num_s=f.streams, ctx=f.ctx, heads=f.heads,
                             dk=f.dk, v_dim=f.v_dim, out_dir=d)
        json.dump(manifest, open(f"{d}/manifest.json", "w"))
        out = subprocess.run([f.triton_python, os.path.abspath(__file__), "--compile_worker",
                              f"{d}/manifest.json"], capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"compile worker failed:\n{out.stderr[-3000:]}")
    stats = {r["key"]: r for r in map(json.loads, out.stdout.splitlines())}
    print(f"ctx={f.ctx} S={f.streams} H={f.heads} Dk={f.dk} v_dim={f.v_dim}, sm_90a")
    print("| config | Q | splits | regs | spill st/ld B | smem B | MMA |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for m in manifest:
        r = stats[m["key"]]
        if "error" in r:
            print(f"| {m['config']} | {m['q']} | {m['splits']} | ERROR {r['error']} | | | |")
            continue
        mma = f"wgmma x{r['wgmma']}" if r["wgmma"] else f"mma.sync x{r['mma']}"
        print(f"| {m['config']} | {m['q']} | {m['splits']} | {r['regs']} | {r['spill_st']}/{r['spill_ld']} | "
              f"{r['smem']} | {mma} |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--compile_worker"]:
        _compile_worker(sys.argv[2])
    else:
        from absl import app, flags

        flags.DEFINE_list("configs", ["32x64x4x2"], "BlockConfigs, BMxBNxWARPSxSTAGES[vV_SPLIT]")
        flags.DEFINE_list("q", ["16", "64", "256"], "new tokens per stream")
        flags.DEFINE_integer("streams", 8, "streams S (sets the split count, as in the benchmark)")
        flags.DEFINE_integer("ctx", 8192, "context length")
        flags.DEFINE_integer("heads", 64, "query heads H")
        flags.DEFINE_integer("dk", 576, "latent width (kv_lora + rope)")
        flags.DEFINE_integer("v_dim", 512, "value width (kv_lora)")
        flags.DEFINE_string("triton_python", None, "a Python with a pip Triton (not the project's venv)")
        flags.mark_flag_as_required("triton_python")
        app.run(main)
