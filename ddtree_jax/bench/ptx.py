"""Registers, spills, shared memory and main-loop instructions of the Pallas:Triton kernels, without
a GPU (experiments/ptx_stats.py): each kernel lowered for CUDA with interpret mode off, its Triton
module's TTIR captured (`dump_*`: a compile manifest), then compiled by `ptx_worker` under a Python
with a pip Triton (`compile_manifest`), and the results as a table (`report_lines`)."""

from __future__ import annotations

import functools
import itertools
import json
import os
import re
import subprocess
import sys

from ddtree_jax.bench import ptx_worker


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



def compile_manifest(triton_python: str, manifest: list[dict], out_dir: str) -> dict:
    """Compile every kernel of `manifest` with `ptx_worker` under `triton_python` (a Python with a
    pip Triton); -> {key: the worker's result}. Exits naming the worker's error if it fails."""
    path = os.path.join(out_dir, "manifest.json")
    json.dump(manifest, open(path, "w"))
    out = subprocess.run([triton_python, os.path.abspath(ptx_worker.__file__), path],
                         capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"compile worker failed:\n{out.stderr[-3000:]}")
    return {r["key"]: r for r in map(_json_or_none, out.stdout.splitlines()) if r and "key" in r}


def report_lines(manifest: list[dict], stats: dict, title: str, size: str, top_ops: int) -> list[str]:
    """A markdown table headed by `title`: per kernel of the manifest (its `size` column: Q, N, S or
    T) registers, spills, shared memory, the MMA and the inline asm's layouts, and the longest
    loop's instructions with its `top_ops` most frequent opcodes; an error row where it failed."""
    lines = [title, f"| config | {size} | splits | regs | spill st/ld B | smem B | MMA | loop instr | top loop opcodes |",
             "|---|---:|---:|---:|---:|---:|---|---:|---|"]
    for m in manifest:
        r = stats.get(m["key"], {"error": "the compile worker printed no result (crashed?)"})
        if "error" in r:
            lines.append(f"| {m['config']} | {m['q']} | {m['splits']} | ERROR {r['error']} | | | | | |")
            continue
        mma = f"wgmma x{r['wgmma']}" if r["wgmma"] else f"mma.sync x{r['mma']}"
        if lay := r.get("asm_layouts"):   # the MoE PTX needs K-row pairs (dim 0) in every layout
            bad = [x for x in lay if not x.endswith("dim 0")]
            mma += f"; asm {', '.join(lay)}" + (" (NOT K-row pairs: wrong results)" if bad else "")
        top = " ".join(f"{k}:{v}" for k, v in list(r["loop_ops"].items())[:top_ops])
        lines.append(f"| {m['config']} | {m['q']} | {m['splits']} | {r['regs']} | {r['spill_st']}/{r['spill_ld']} | "
                     f"{r['smem']} | {mma} | {r['loop']} | {top} |")
    return lines
