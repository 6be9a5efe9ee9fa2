"""The compile half of experiments/ptx_stats.py, run by a Python with a pip Triton (not the
project's venv, which has none; nor has that Python JAX): each TTIR (or raw Triton kernel) of a
manifest compiled for sm_90a, then ptxas -v and cuobjdump, one JSON line per kernel. Only the
standard library and Triton are imported, so `python ptx_worker.py manifest.json` runs there; the
readers of its text (loop_mix, asm_layouts) are tested in the project's venv.
"""

from __future__ import annotations

import collections
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
    """Under the pip Triton: the ASTSource of a raw Triton kernel of the repo (item: raw_kernel
    "module:function", arg_types of its pointer arguments in order, constexprs), with every
    pointer 16-byte aligned as jax-triton declares them (Triton's pipeliner needs that to copy
    2-byte loads asynchronously). The repo's packages are entered without their __init__ (they
    import JAX, which this Python lacks)."""
    import importlib
    import types

    from triton.compiler import ASTSource

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the repository
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


def compile_worker(manifest_path: str) -> None:
    """Runs under the pip Triton: compile each TTIR of the manifest, print one JSON line each."""
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




if __name__ == "__main__":
    compile_worker(sys.argv[1])
