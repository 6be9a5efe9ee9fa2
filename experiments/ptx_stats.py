"""Registers, spills, shared memory and main-loop instructions of the Pallas:Triton kernels, without a GPU.

  python3 -m venv /tmp/tvenv && /tmp/tvenv/bin/pip install triton==3.6.0
  PYTHONPATH=$PWD .venv/bin/python experiments/ptx_stats.py --triton_python=/tmp/tvenv/bin/python \\
      --kernel=mla --configs=32x64x4x2,tp128x128x8x3-128x256x64x8x3 --q=16,64,256 --streams=8 --ctx=8192
  PYTHONPATH=$PWD .venv/bin/python experiments/ptx_stats.py --triton_python=/tmp/tvenv/bin/python \\
      --kernel=moe --moe_tokens=16,256 --moe_variants='bn_up=128'

Lowers a kernel for the CUDA platform with interpret mode off (Pallas emits Triton IR; no GPU
needed), captures each Triton module's TTIR, and compiles it for sm_90a with a pip Triton living in
a separate Python (--triton_python; the project's venv has none): first Triton's TTIR stage
(canonicalize, combine, CSE, loop unroll, as XLA runs it for Pallas kernels), then TTGIR, PTX,
ptxas -v and cuobjdump. Reports per kernel: registers per thread, spill stores/loads (bytes),
Triton's shared memory (bytes), which MMA the PTX uses (wgmma = Hopper warpgroup MMA, mma = the
older mma.sync), the layouts its inline PTX runs in (`asm_layouts`, flagged where a thread's
register pair is not two K rows), and the SASS instructions of the longest loop (per thread per
iteration) with its most frequent opcodes. The pip Triton's pipeline is close to, not the same as,
the one jaxlib bundles on the GPU. The compiles run in ddtree_jax/bench/ptx_worker.py, which
--triton_python runs by path (the lowering and the table: ddtree_jax/bench/ptx.py).

--kernel=moe: the INT4 MoE gate_up and down kernels at the Kimi-K2 layer shape (E=384, d=7168,
I=2048, top-8), each T's tuned config, plus each --moe_variants option set on top of it (the
syntax of kernel_bench.py --variants). --kernel=moe_triton: the same for the raw Triton kernels
(the "triton" implementation), compiled from their source as jax-triton does. --kernel=drafter: the drafter's block attention
(pallas_kernels/drafter_attention) at --drafter_dims (the shipped drafter's by default) for each
context length in --drafter_ctx and each BLOCK_NxWARPSxSTAGES in --drafter_configs:

  PYTHONPATH=$PWD .venv/bin/python experiments/ptx_stats.py --triton_python=/tmp/tvenv/bin/python \
      --kernel=drafter --drafter_ctx=256,1024 --drafter_configs=64x4x1,32x4x1

--kernel=drafter_qkv / tree_accept: the drafter's fused projection (block and context forms) and
the accept kernel at the shipped pair's shapes, per stream count in --small_streams.
--kernel=mla_merge: the MLA split runs' merge (pallas_kernels/mla_attention/merge.py) per run count
in --merge_parts and stream count in --small_streams. A kernel that Triton rejects shows its error
here, before any device time is spent on it.
"""

from __future__ import annotations

import os
import tempfile

from absl import app, flags

from ddtree_jax.bench import ptx
from ddtree_jax.bench.moe import parse_variants
from pallas_kernels.mla_attention.pallas_triton import parse_config

FLAGS = flags.FLAGS
flags.DEFINE_integer("top_ops", 8, "opcodes listed per kernel loop, most frequent first")
flags.DEFINE_string("ttir_dir", "", "keep each kernel's TTIR (as lowered, and after the TTIR stage) here")
flags.DEFINE_list("small_streams", ["1", "16"], "drafter_qkv, tree_accept, mla_merge: stream counts")
flags.DEFINE_list("merge_parts", ["8", "16", "64", "132"], "mla_merge: split runs K")
flags.DEFINE_list("merge_forms", ["auto"], "mla_merge: forms, 'auto' (merge.form_for), 'rows' / 'parts' "
                  "(with merge.STEP's kc and warps) or 'FORM:KCxWARPS'")
flags.DEFINE_enum("kernel", "mla", ["mla", "moe", "moe_triton", "drafter", "drafter_qkv", "tree_accept",
                                    "mla_merge"],
                  "which kernel to compile (moe_triton: the raw Triton MoE kernels)")
flags.DEFINE_list("configs", ["32x64x4x2"], "mla: one-pass BMxBNxWARPSxSTAGES or two-pass tpMxNxWxS-MxVxKxWxS")
flags.DEFINE_list("q", ["16", "64", "256"], "mla: new tokens per stream")
flags.DEFINE_integer("streams", 8, "mla: streams S (sets the split count, as in the benchmark)")
flags.DEFINE_integer("ctx", 8192, "mla: context length")
flags.DEFINE_integer("heads", 64, "mla: query heads H")
flags.DEFINE_integer("dk", 576, "mla: latent width (kv_lora + rope)")
flags.DEFINE_integer("v_dim", 512, "mla: value width (kv_lora)")
flags.DEFINE_list("moe_tokens", ["16", "64", "256"], "moe: token counts T (each uses its tuned config)")
flags.DEFINE_enum("moe_scale_dtype", "bfloat16", ["bfloat16", "float16"],
                  "moe: the experts' scales (float16: the kernels multiply in float16)")
flags.DEFINE_string("moe_variants", "", "moe: option sets on top of the tuned config, as "
                    "kernel_bench.py --variants ('f=v,f=v;f=v')")
flags.DEFINE_list("drafter_dims", ["1", "16", "4", "1", "64"],
                  "drafter: streams, block, heads, KV heads, head_dim (the shipped drafter)")
flags.DEFINE_list("drafter_ctx", ["256", "1024"], "drafter: context slots N")
flags.DEFINE_list("drafter_configs", ["64x4x1"], "drafter: BLOCK_NxWARPSxSTAGES (splits: "
                  "the kernel's default for the shape)")
flags.DEFINE_string("triton_python", None, "a Python with a pip Triton (not the project's venv)")
flags.mark_flag_as_required("triton_python")


def main(_):
    f = FLAGS
    with tempfile.TemporaryDirectory() as tmp:
        d = f.ttir_dir or tmp
        os.makedirs(d, exist_ok=True)
        if f.kernel == "mla":
            manifest = ptx.dump_mla([parse_config(c) for c in f.configs], [int(x) for x in f.q],
                                    num_s=f.streams, ctx=f.ctx, heads=f.heads, dk=f.dk, v_dim=f.v_dim, out_dir=d)
            head = (f"MLA ctx={f.ctx} S={f.streams} H={f.heads} Dk={f.dk} v_dim={f.v_dim}, sm_90a", "Q")
        elif f.kernel == "drafter":
            dims = tuple(int(x) for x in f.drafter_dims)
            manifest = ptx.dump_drafter(f.drafter_configs, [int(x) for x in f.drafter_ctx], dims=dims,
                                        out_dir=d)
            head = (f"drafter block attention, (S, b, H, KV, hd) = {dims}, sm_90a", "N")
        elif f.kernel == "mla_merge":
            manifest = ptx.dump_mla_merge([int(x) for x in f.merge_parts], [int(x) for x in f.small_streams],
                                          f.merge_forms, out_dir=d)
            head = ("MLA split runs' merge, 64 rows x 512 columns per stream, bf16, sm_90a", "S")
        elif f.kernel in ("drafter_qkv", "tree_accept"):
            dump = ptx.dump_drafter_qkv if f.kernel == "drafter_qkv" else ptx.dump_tree_accept
            manifest = dump([int(x) for x in f.small_streams], out_dir=d)
            head = (f"{f.kernel}, shipped pair's shapes, sm_90a", "S")
        elif f.kernel == "moe_triton":
            manifest = ptx.dump_moe_triton([int(x) for x in f.moe_tokens], parse_variants(f.moe_variants),
                                           scale_dtype=f.moe_scale_dtype)
            head = ("INT4 MoE, raw Triton kernels, K2 layer (E=384, d=7168, I=2048, top-8), sm_90a", "T")
        else:
            manifest = ptx.dump_moe([int(x) for x in f.moe_tokens], parse_variants(f.moe_variants), out_dir=d,
                                    scale_dtype=f.moe_scale_dtype)
            head = ("INT4 MoE, K2 layer (E=384, d=7168, I=2048, top-8), sm_90a", "T")
        stats = ptx.compile_manifest(f.triton_python, manifest, d)
    print("\n".join(ptx.report_lines(manifest, stats, *head, top_ops=f.top_ops)))


if __name__ == "__main__":
    app.run(main)
