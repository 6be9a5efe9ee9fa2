"""Registers, spills, shared memory and main-loop instructions of the Pallas:Triton kernels, without a GPU.

Lowers a kernel for the CUDA platform with interpret mode off (Pallas emits Triton IR; no GPU
needed), captures each Triton module's TTIR, and compiles it for sm_90a with a pip Triton living in
a separate Python (--triton_python; the project's venv has none): first Triton's TTIR stage
(canonicalize, combine, CSE, loop unroll, as XLA runs it for Pallas kernels), then TTGIR, PTX,
ptxas -v and cuobjdump. Reports per kernel: registers per thread, spill stores/loads (bytes),
Triton's shared memory (bytes), which MMA the PTX uses (wgmma = Hopper warpgroup MMA, mma = the
older mma.sync), the layouts its inline PTX runs in (`asm_layouts`, flagged where a thread's
register pair is not two K rows), and the SASS instructions of the longest loop (per thread per
iteration) with its most frequent opcodes. The pip Triton's pipeline is close to, not the same as,
the one jaxlib bundles on the GPU.

  python3 -m venv /tmp/tvenv && /tmp/tvenv/bin/pip install triton==3.6.0
  PYTHONPATH=$PWD .venv/bin/python experiments/ptx_stats.py --triton_python=/tmp/tvenv/bin/python \\
      --kernel=mla --configs=32x64x4x2,tp128x128x8x3-128x256x64x8x3 --q=16,64,256 --streams=8 --ctx=8192
  PYTHONPATH=$PWD .venv/bin/python experiments/ptx_stats.py --triton_python=/tmp/tvenv/bin/python \\
      --kernel=moe --moe_tokens=16,256 --moe_variants='bn_up=128'

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

import collections
import functools
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile


def _optimize_ttir(path: str) -> str:
    """Run Triton's TTIR stage (make_ttir) on a TTIR file, as XLA does for Pallas kernels; returns
    the optimised file. `triton.compile` starts *after* that stage when given a .ttir file, so
    without this `acc + dot(a, b)` stays an MMA into zeros plus a float add, and registers are
    overstated."""
    from triton._C.libtriton import ir, passes

    ctx = ir.context()
    ir.load_dialects(ctx)
    mod = ir.parse_mlir_module(path, ctx)
    pm = ir.pass_manager(ctx)
    passes.common.add_inliner(pm)
    passes.ttir.add_rewrite_tensor_pointer(pm)
    passes.common.add_canonicalizer(pm)
    passes.ttir.add_combine(pm)
    passes.ttir.add_reorder_broadcast(pm)
    passes.common.add_cse(pm)
    passes.common.add_symbol_dce(pm)
    passes.ttir.add_loop_unroll(pm)
    pm.run(mod, "make_ttir")
    out = path[: -len(".ttir")] + ".opt.ttir"
    open(out, "w").write(str(mod))
    return out


def loop_mix(sass: str) -> tuple[int, collections.Counter]:
    """SASS text -> (instructions, opcode counts) of the longest loop (a backward branch's body)."""
    ins = [(int(m.group(1), 16), m.group(2).strip())
           for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    best = []
    for addr, text in ins:
        m = re.search(r"\bBRA\s+(?:`?\(?\.L_x_\d+\)?|0x([0-9a-f]+))", text)
        if m and m.group(1) and int(m.group(1), 16) < addr:
            body = [t for a, t in ins if int(m.group(1), 16) <= a <= addr]
            best = max(best, body, key=len)
    ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for t in best)
    return len(best), ops


def _pair_dim(enc: str) -> int | None:
    """A TTGIR layout -> the tensor dimension along which a thread's registers 0 and 1 lie (the
    pair `packed_element = 2` inline asm receives), or None when it cannot tell."""
    if m := re.match(r"#ttg\.dot_op<\{opIdx = (\d+).*?kWidth = (\d+)", enc):
        # an MMA operand's registers run along K: dim 0 of B [K, N], dim 1 of A [M, K]
        return (1 if m.group(1) == "0" else 0) if int(m.group(2)) >= 2 else None
    if m := re.match(r"#ttg\.blocked<\{sizePerThread = \[([\d, ]+)\].*?order = \[([\d, ]+)\]", enc):
        size, order = ([int(x) for x in g.split(",")] for g in m.groups())
        return next((d for d in order if size[d] > 1), None)
    if m := re.match(r"#ttg\.linear<\{register = \[\[([\d, ]+)\]", enc):
        step = [int(x) for x in m.group(1).split(",")]
        return step.index(1) if sorted(step) == [0] * (len(step) - 1) + [1] else None
    return None


def asm_layouts(ttgir: str) -> list[str]:
    """TTGIR text -> for each distinct result layout of its inline-asm ops, "kind: pairs along dim
    d" (kind dot_op / blocked / linear ...; d the dimension of a thread's registers 0 and 1, "?"
    when unknown), sorted. The MoE kernels' PTX dequantisation takes its two packed elements as K
    rows (r, r + 1) of one column of a [K, N] tile: right only with pairs along dim 0 (wrong
    results otherwise: docs/kernels/moe.md)."""
    alias = dict(re.findall(r"^(#\w+) = (#[\w.]+<.*)$", ttgir, re.M))
    found = set()
    for m in re.finditer(r"elementwise_inline_asm.*->\s*(?:\()?tensor<[^,>]+,\s*(#[\w.]+(?:<\{[^}]*\}>)?)", ttgir):
        enc = alias.get(m.group(1), m.group(1))
        dim = _pair_dim(enc)
        kind = re.match(r"#(?:ttg\.)?([a-z_]+)", enc).group(1)
        found.add(f"{kind}: pairs along dim {'?' if dim is None else dim}")
    return sorted(found)


def _raw_source(item: dict):
    """Under --triton_python: the ASTSource of a raw Triton kernel of the repo (item: raw_kernel
    "module:function", arg_types of its pointer arguments in order, constexprs), with every
    pointer 16-byte aligned as jax-triton declares them (Triton's pipeliner needs that to copy
    2-byte loads asynchronously). The repo's packages are entered without their __init__ (they
    import JAX, which this Python lacks)."""
    import importlib
    import types

    from triton.compiler import ASTSource

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    module, name = item["raw_kernel"].split(":")
    parts = module.split(".")
    for i in range(1, len(parts)):
        pkg = ".".join(parts[:i])
        if pkg not in sys.modules:
            sys.modules[pkg] = types.ModuleType(pkg)
            sys.modules[pkg].__path__ = [os.path.join(root, *parts[:i])]
    fn = getattr(importlib.import_module(module), name)
    consts = item["constexprs"]
    sig = dict(zip([a for a in fn.arg_names if a not in consts], item["arg_types"], strict=True))
    sig.update({c: "constexpr" for c in consts})
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names) if sig[a].startswith("*")}
    return ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)


def _compile_worker(manifest_path: str) -> None:
    """Runs under --triton_python: compile each TTIR of the manifest, print one JSON line each."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import compile as triton_compile

    import triton

    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    for item in json.load(open(manifest_path)):
        res = {"key": item["key"]}
        try:
            src = _raw_source(item) if "raw_kernel" in item else _optimize_ttir(item["ttir"])
            k = triton_compile(src, target=GPUTarget("cuda", 90, 32),
                               options={"num_warps": item["num_warps"], "num_stages": item["num_stages"]})
            ptx = k.asm["ptx"]
            with tempfile.TemporaryDirectory() as d:
                open(f"{d}/k.ptx", "w").write(ptx)
                open(f"{d}/k.cubin", "wb").write(k.asm["cubin"])
                log = subprocess.run([f"{bin_dir}/ptxas", "-v", "--gpu-name", "sm_90a", f"{d}/k.ptx", "-o",
                                      f"{d}/k2.cubin"], capture_output=True, text=True, check=True).stderr
                sass = subprocess.run([f"{bin_dir}/cuobjdump", "-sass", f"{d}/k.cubin"], capture_output=True,
                                      text=True, check=True).stdout
            n_loop, ops = loop_mix(sass)
            res.update(regs=int(re.search(r"Used (\d+) registers", log).group(1)),
                       spill_st=int(re.search(r"(\d+) bytes spill stores", log).group(1)),
                       spill_ld=int(re.search(r"(\d+) bytes spill loads", log).group(1)),
                       smem=k.metadata.shared, wgmma=ptx.count("wgmma.mma_async"), mma=ptx.count("mma.sync"),
                       loop=n_loop, loop_ops=dict(ops.most_common()), asm_layouts=asm_layouts(k.asm["ttgir"]))
        except Exception as e:  # report and go on: one config failing must not end the table
            res["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:200]}"
        print(json.dumps(res), flush=True)


def _json_or_none(line: str):
    """A worker result line, or None for anything else the compiler printed to stdout."""
    try:
        return json.loads(line)
    except ValueError:
        return None


class _Capture:
    """Patches the Pallas:Triton lowering to keep every TTIR module it emits, interpret mode off."""

    def __init__(self, *modules_with_interpret):
        self.modules, self.patches = [], []
        self.targets = modules_with_interpret

    def __enter__(self):
        from unittest import mock

        import jax
        from jax._src.pallas.triton import pallas_call_registration as reg

        lower = reg.lowering.lower_jaxpr_to_triton_module

        def capture(*args, **kwargs):
            res = lower(*args, **kwargs)
            self.modules.append(res.module.operation.get_asm(enable_debug_info=False))
            return res

        self.patches = [mock.patch.object(m, "interpret_mode", lambda: False) for m in self.targets]
        self.patches.append(mock.patch.object(reg.lowering, "lower_jaxpr_to_triton_module", capture))
        for p in self.patches:
            p.start()
        jax.clear_caches()                       # earlier traces were made in interpret mode
        return self

    def __exit__(self, *exc):
        for p in reversed(self.patches):
            p.stop()


def _write(out_dir: str, key: str, ttir: str) -> str:
    path = os.path.join(out_dir, re.sub(r"\W", "_", key) + ".ttir")
    open(path, "w").write(ttir)
    return path


def dump_mla(configs, qs, *, num_s, ctx, heads, dk, v_dim, out_dir) -> list[dict]:
    """Lower the MLA kernels for CUDA per (config, Q) and write their TTIR; returns the compile
    manifest. A two-pass config ('tp...') gives three kernels: its context and tree scores and its
    P @ V GEMM."""
    import jax
    import jax.numpy as jnp

    from pallas_kernels.mla_attention import pallas_triton, two_pass

    manifest = []
    with _Capture(pallas_triton, two_pass) as cap:
        for cfg in configs:
            for num_q in qs:
                specs = (jax.ShapeDtypeStruct((num_s, num_q, heads, dk), jnp.bfloat16),
                         jax.ShapeDtypeStruct((num_s, ctx + num_q, dk), jnp.bfloat16),
                         jax.ShapeDtypeStruct((num_s,), jnp.int32),
                         jax.ShapeDtypeStruct((num_s, num_q, -(-num_q // 32)), jnp.int32))
                fn = lambda *a, cfg=cfg: pallas_triton.mla_attention_pallas(*a, scale=dk ** -0.5, v_dim=v_dim,
                                                                            config=cfg)
                before = len(cap.modules)
                jax.jit(fn).trace(*specs).lower(lowering_platforms=("cuda",))
                if isinstance(cfg, two_pass.TwoPassConfig):
                    parts = [("scores", cfg.score_warps, cfg.score_stages),
                             ("edge_scores", cfg.score_warps, cfg.score_stages), ("pv", cfg.pv_warps, cfg.pv_stages)]
                    splits = 1
                else:
                    parts = [("", cfg.num_warps, cfg.num_stages)]
                    splits = cfg.num_splits or pallas_triton.default_splits(
                        num_s, num_q * heads, ctx + num_q, cfg.block_m)
                for (part, warps, stages), ttir in zip(parts, cap.modules[before:]):
                    key = f"{cfg.name}{' ' + part if part else ''} Q={num_q}"
                    manifest.append(dict(key=key, config=f"{cfg.name}{' ' + part if part else ''}", q=num_q,
                                         splits=splits, ttir=_write(out_dir, key, ttir), num_warps=warps,
                                         num_stages=stages))
    return manifest


def dump_drafter(configs, ctxs, *, dims, out_dir) -> list[dict]:
    """Lower the drafter's block attention per (BLOCK_NxWARPSxSTAGES, context length), bf16
    operands, and write its TTIR. dims: (streams, block, heads, kv_heads, head_dim)."""
    import jax
    import jax.numpy as jnp

    from pallas_kernels.drafter_attention import pallas_triton

    num_s, b, h, kvh, hd = dims
    manifest = []
    with _Capture(pallas_triton) as cap:
        for cfg in configs:
            block_n, warps, stages = (int(x) for x in cfg.split("x"))
            for n in ctxs:
                bf = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16)   # noqa: E731
                # the engine's form: a stacked two-layer cache, read at layer 1
                specs = (bf(num_s, b, h, hd), bf(2, num_s, kvh, n, hd), bf(2, num_s, kvh, n, hd),
                         jax.ShapeDtypeStruct((num_s,), jnp.int32), bf(num_s, b, kvh, hd),
                         bf(num_s, b, kvh, hd))
                fn = functools.partial(pallas_triton.drafter_attention_pallas, scale=hd ** -0.5,
                                       layer=1, block_n=block_n, num_warps=warps, num_stages=stages)
                jax.jit(fn).trace(*specs).lower(lowering_platforms=("cuda",))
                key = f"{cfg} N={n}"
                splits = pallas_triton.default_splits(num_s * kvh, n, block_n)
                manifest.append(dict(key=key, config=cfg, q=n, splits=splits,
                                     ttir=_write(out_dir, key, cap.modules[-1]),
                                     num_warps=warps, num_stages=stages))
    return manifest


def dump_drafter_qkv(streams, *, out_dir) -> list[dict]:
    """Lower the drafter's fused projection (pallas_kernels/drafter_qkv) at the shipped drafter's
    shape (d 256, 4 heads over 1 KV head of 64), block (q, k, v; 16 slots a stream) and context
    (k, v) forms, bf16, per stream count, and write its TTIR."""
    import jax
    import jax.numpy as jnp

    from pallas_kernels.drafter_qkv import pallas_triton

    bf = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16)   # noqa: E731
    manifest = []
    with _Capture(pallas_triton) as cap:
        for form in ("block", "context"):
            for num_s in streams:
                q = form == "block"
                specs = (bf(num_s, 16, 256), jax.ShapeDtypeStruct((num_s, 16), jnp.int32),
                         bf(256, 256) if q else None, bf(256, 64), bf(256, 64), bf(64) if q else None,
                         bf(64), jax.ShapeDtypeStruct((32,), jnp.float32), bf(256))
                fn = lambda x, p, wq, wk, wv, qn, kn, f, nm: pallas_triton.drafter_qkv_pallas(  # noqa: E731
                    x, p, wq, wk, wv, qn, kn, f, norm=nm, eps=1e-6)
                jax.jit(fn).trace(*specs).lower(lowering_platforms=("cuda",))
                key = f"{form} S={num_s}"
                manifest.append(dict(key=key, config=form, q=num_s, splits=1,
                                     ttir=_write(out_dir, key, cap.modules[-1]), num_warps=4,
                                     num_stages=1))
    return manifest


def dump_tree_accept(streams, *, out_dir) -> list[dict]:
    """Lower the accept kernel (pallas_kernels/tree_accept) at the engine's shipped-pair shape
    (budget 64, 15 draft depths, 4 layers of 80-wide bf16 latent cache, taps 512 wide) per stream
    count, and write its TTIR."""
    import jax
    import jax.numpy as jnp

    from ddtree_jax.tree import Tree
    from pallas_kernels.tree_accept import pallas_triton

    i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)   # noqa: E731
    manifest = []
    with _Capture(pallas_triton) as cap:
        for num_s in streams:
            n, d = 65, 15
            tree = Tree(tokens=i32(num_s, n - 1), depths=i32(num_s, n - 1), parents=i32(num_s, n),
                        num_nodes=i32(num_s), visibility=jax.ShapeDtypeStruct((num_s, n, n), jnp.bool_),
                        node_mask=i32(num_s, n, 3),
                        scores=jax.ShapeDtypeStruct((num_s, n - 1), jnp.float32), max_depth=d)
            kv = tuple(jax.ShapeDtypeStruct((num_s, 320, 80), jnp.bfloat16) for _ in range(4))
            specs = (tree, i32(num_s, n), i32(num_s, n), i32(num_s),
                     jax.ShapeDtypeStruct((num_s,), jnp.bool_), kv,
                     jax.ShapeDtypeStruct((num_s, n, 512), jnp.bfloat16))
            jax.jit(pallas_triton.tree_accept_pallas).trace(*specs).lower(lowering_platforms=("cuda",))
            key = f"tree_accept S={num_s}"
            manifest.append(dict(key=key, config="tree_accept", q=num_s, splits=1,
                                 ttir=_write(out_dir, key, cap.modules[-1]), num_warps=4,
                                 num_stages=1))
    return manifest


def dump_mla_merge(parts, streams, forms=("auto",), *, rows=64, v_dim=512, out_dir) -> list[dict]:
    """Lower the split runs' merge kernel (pallas_kernels/mla_attention/merge.py) for each part
    count K, stream count S and form spec ("auto": merge.form_for(K); "rows" / "parts": that form's
    merge.STEP; "FORM:KCxWARPS"; bf16 parts of `rows` rows, bf16 output), and write its TTIR."""
    import jax
    import jax.numpy as jnp

    from pallas_kernels.mla_attention import merge

    manifest = []
    with _Capture(merge) as cap:
        for k, num_s, spec in itertools.product(parts, streams, forms):
            form, _, shape = spec.partition(":")
            form = merge.form_for(k) if form == "auto" else form
            kc, warps = (int(x) for x in shape.split("x")) if shape else merge.STEP[form]
            specs = (jax.ShapeDtypeStruct((k * num_s, rows, v_dim), jnp.bfloat16),
                     jax.ShapeDtypeStruct((k * num_s, rows), jnp.float32), jax.ShapeDtypeStruct((num_s,), jnp.int32))
            jax.jit(lambda o, lse, lens: merge.merge_splits(o, lse, lens, jnp.bfloat16, num_q=1, kc=kc, warps=warps,
                                                            form=form)).trace(*specs).lower(lowering_platforms=("cuda",))
            key = f"mla_merge {form} kc{kc} w{warps} K={k} S={num_s}"
            manifest.append(dict(key=key, config=f"mla_merge {form} kc{kc} w{warps} K={k}", q=num_s, splits=k,
                                 ttir=_write(out_dir, key, cap.modules[-1]), num_warps=warps, num_stages=2))
    return manifest


def dump_moe(tokens, variant_sets, *, experts=384, hidden=7168, inter=2048, topk=8, out_dir,
             scale_dtype="bfloat16") -> list[dict]:
    """Lower the INT4 MoE kernels (gate_up, down) per (T, option set) and write their TTIR; bf16
    activations, the experts' scales in scale_dtype (float16: the kernels multiply in float16)."""
    import jax
    import jax.numpy as jnp

    from pallas_kernels.moe import pallas_triton, tuning

    def spec(k, n):   # kernel layout: qweight [E, K/8, N] int32, qscale [E, K/32, N]
        return (jax.ShapeDtypeStruct((experts, k // 8, n), jnp.int32),
                jax.ShapeDtypeStruct((experts, k // 32, n), jnp.dtype(scale_dtype)))

    ex = {}
    for name, (k, n) in {"gate": (hidden, inter), "up": (hidden, inter), "down": (inter, hidden)}.items():
        ex[f"{name}_qweight"], ex[f"{name}_qscale"] = spec(k, n)
    manifest = []
    with _Capture(pallas_triton) as cap:
        for t in tokens:
            for opts in [{}] + list(variant_sets):
                cfg = tuning.config(t)._replace(**opts)
                fn = lambda x, ids, w, e, cfg=cfg: pallas_triton.moe_experts_pallas(x, ids, w, e, cfg=cfg)
                jax.jit(fn).trace(jax.ShapeDtypeStruct((t, hidden), jnp.bfloat16),
                                  jax.ShapeDtypeStruct((t, topk), jnp.int32),
                                  jax.ShapeDtypeStruct((t, topk), jnp.float32),
                                  ex).lower(lowering_platforms=("cuda",))
                label = ",".join(f"{k}={v}" for k, v in opts.items()) or "tuned"
                for kernel, ttir in zip(("gate_up", "down"), cap.modules[-2:]):
                    warps = cfg.num_warps if kernel == "gate_up" else cfg.down_warps or cfg.num_warps
                    stages = cfg.num_stages if kernel == "gate_up" else cfg.down_stages or cfg.num_stages
                    key = f"T={t} {label} {kernel}"
                    manifest.append(dict(key=key, config=f"{label} {kernel}", q=t, splits=cfg.split_k,
                                         ttir=_write(out_dir, key, ttir), num_warps=warps, num_stages=stages))
    return manifest


def dump_moe_triton(tokens, variant_sets, *, experts=384, hidden=7168, inter=2048, topk=8,
                    scale_dtype="bfloat16") -> list[dict]:
    """The raw Triton MoE kernels (pallas_kernels/moe/triton_impl.py) per (T, option set), as
    slot_experts would launch them (bf16 activations; float16 compute with float16 scales)."""
    import jax
    import jax.numpy as jnp

    from pallas_kernels.moe import dims, pallas_triton, triton_impl, tuning
    from pallas_kernels.moe.align import align_routing

    types = {jnp.dtype(jnp.int32): "*i32", jnp.dtype(jnp.float32): "*fp32", jnp.dtype(jnp.float16): "*fp16",
             jnp.dtype(jnp.bfloat16): "*bf16"}
    sds = jax.ShapeDtypeStruct
    ex = {}
    for name, (k, n) in {"gate": (hidden, inter), "up": (hidden, inter), "down": (inter, hidden)}.items():
        ex[f"{name}_qweight"] = sds((experts, k // 8, n), jnp.int32)
        ex[f"{name}_qscale"] = sds((experts, k // 32, n), jnp.dtype(scale_dtype))
    dm = dims(ex)
    manifest = []
    for t in tokens:
        for opts in [{}] + list(variant_sets):
            cfg = tuning.config(t)._replace(**opts)
            r = jax.eval_shape(lambda ids, bm=cfg.bm: align_routing(ids, experts, bm), sds((t, topk), jnp.int32))
            f16 = pallas_triton.f16_compute(jnp.bfloat16, ex, cfg)
            act, n_slots = (jnp.float16 if f16 else jnp.bfloat16), t * topk
            launches = [triton_impl.gate_up_launch(sds((t, hidden), act), r.row_slot, r.block_expert, ex, dm, cfg, topk,
                                                   sds((t,), jnp.float32) if f16 else None),
                        triton_impl.down_launch(sds((n_slots, inter), act), r.row_slot, sds((n_slots,), jnp.float32),
                                                r.block_expert, ex, dm, cfg)]
            label = ",".join(f"{k}={v}" for k, v in opts.items()) or "tuned"
            for ln in launches:
                arg_types = [types[jnp.dtype(a.dtype)] for a in ln.args]
                arg_types += [arg_types[0], types[jnp.dtype(ln.out_shape.dtype)]]   # into_ptr, the output
                manifest.append(dict(key=f"T={t} {label} {ln.kernel}", config=f"{label} {ln.kernel}", q=t, splits=1,
                                     raw_kernel=f"pallas_kernels.moe._triton_kernels:{ln.kernel}",
                                     arg_types=arg_types, constexprs=ln.constants, num_warps=ln.num_warps,
                                     num_stages=ln.num_stages))
    return manifest


def main(_):
    from absl import flags

    f = flags.FLAGS
    with tempfile.TemporaryDirectory() as tmp:
        d = f.ttir_dir or tmp
        os.makedirs(d, exist_ok=True)
        if f.kernel == "mla":
            from pallas_kernels.mla_attention.pallas_triton import parse_config
            manifest = dump_mla([parse_config(c) for c in f.configs], [int(x) for x in f.q],
                                num_s=f.streams, ctx=f.ctx, heads=f.heads, dk=f.dk, v_dim=f.v_dim, out_dir=d)
            head = (f"MLA ctx={f.ctx} S={f.streams} H={f.heads} Dk={f.dk} v_dim={f.v_dim}, sm_90a", "Q")
        elif f.kernel == "drafter":
            dims = tuple(int(x) for x in f.drafter_dims)
            manifest = dump_drafter(f.drafter_configs, [int(x) for x in f.drafter_ctx], dims=dims,
                                    out_dir=d)
            head = (f"drafter block attention, (S, b, H, KV, hd) = {dims}, sm_90a", "N")
        elif f.kernel == "mla_merge":
            manifest = dump_mla_merge([int(x) for x in f.merge_parts], [int(x) for x in f.small_streams],
                                      f.merge_forms, out_dir=d)
            head = ("MLA split runs' merge, 64 rows x 512 columns per stream, bf16, sm_90a", "S")
        elif f.kernel in ("drafter_qkv", "tree_accept"):
            dump = dump_drafter_qkv if f.kernel == "drafter_qkv" else dump_tree_accept
            manifest = dump([int(x) for x in f.small_streams], out_dir=d)
            head = (f"{f.kernel}, shipped pair's shapes, sm_90a", "S")
        elif f.kernel == "moe_triton":
            from experiments.kernel_bench import parse_variants
            manifest = dump_moe_triton([int(x) for x in f.moe_tokens], parse_variants(f.moe_variants),
                                       scale_dtype=f.moe_scale_dtype)
            head = ("INT4 MoE, raw Triton kernels, K2 layer (E=384, d=7168, I=2048, top-8), sm_90a", "T")
        else:
            from experiments.kernel_bench import parse_variants
            manifest = dump_moe([int(x) for x in f.moe_tokens], parse_variants(f.moe_variants), out_dir=d,
                                scale_dtype=f.moe_scale_dtype)
            head = ("INT4 MoE, K2 layer (E=384, d=7168, I=2048, top-8), sm_90a", "T")
        json.dump(manifest, open(f"{d}/manifest.json", "w"))
        out = subprocess.run([f.triton_python, os.path.abspath(__file__), "--compile_worker",
                              f"{d}/manifest.json"], capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"compile worker failed:\n{out.stderr[-3000:]}")
    stats = {r["key"]: r for r in map(_json_or_none, out.stdout.splitlines()) if r and "key" in r}
    print(head[0])
    print(f"| config | {head[1]} | splits | regs | spill st/ld B | smem B | MMA | loop instr | top loop opcodes |")
    print("|---|---:|---:|---:|---:|---:|---|---:|---|")
    for m in manifest:
        r = stats.get(m["key"], {"error": "the compile worker printed no result (crashed?)"})
        if "error" in r:
            print(f"| {m['config']} | {m['q']} | {m['splits']} | ERROR {r['error']} | | | | | |")
            continue
        mma = f"wgmma x{r['wgmma']}" if r["wgmma"] else f"mma.sync x{r['mma']}"
        if lay := r.get("asm_layouts"):   # the MoE PTX needs K-row pairs (dim 0) in every layout
            bad = [x for x in lay if not x.endswith("dim 0")]
            mma += f"; asm {', '.join(lay)}" + (" (NOT K-row pairs: wrong results)" if bad else "")
        top = " ".join(f"{k}:{v}" for k, v in list(r["loop_ops"].items())[:f.top_ops])
        print(f"| {m['config']} | {m['q']} | {m['splits']} | {r['regs']} | {r['spill_st']}/{r['spill_ld']} | "
              f"{r['smem']} | {mma} | {r['loop']} | {top} |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--compile_worker"]:
        _compile_worker(sys.argv[2])
    else:
        from absl import app, flags

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
        app.run(main)
