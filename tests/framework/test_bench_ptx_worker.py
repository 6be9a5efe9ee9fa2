"""ddtree_jax/bench/ptx_worker.py's TTGIR reading (experiments/ptx_stats.py; the compiles themselves need a
separate pip Triton)."""

from __future__ import annotations

from ddtree_jax.bench.ptx_worker import asm_layouts

_ASM = ('%p = tt.elementwise_inline_asm "{\\0Aand.b32 $0, $1, 0x000F000F;\\0Afma.rn.bf16x2 $0, $0, $3, $4;\\0A}" '
        '{constraints = "=r,r,r,r,r", packed_element = 2 : i32, pure = true} %q, %sb, %cb : {ins} -> {out} loc(#loc1)')
_DOT = "tensor<32x64xbf16, #ttg.dot_op<{opIdx = 1, parent = #mma, kWidth = 2}>>"
_HEAD = ("#blocked = #ttg.blocked<{sizePerThread = [1, 8], threadsPerWarp = [4, 8], warpsPerCTA = [4, 1], order = [1, 0]}>\n"
         "#mma = #ttg.nvidia_mma<{versionMajor = 2, versionMinor = 0, warpsPerCTA = [1, 4], instrShape = [16, 8]}>\n")


def _op(out: str) -> str:
    return _ASM.replace("{ins}", f"tensor<32x64xi32, {out.split(', ', 1)[1][:-1]}>").replace("{out}", out)


def test_asm_layouts_reads_the_inline_ptx_register_pairs():
    """Lines as pip Triton 3.6.0 writes them for the MoE kernels: the tuned kernel's
    PTX dequantisation in the mma.sync B-operand layout (K-row pairs, right on the H200); a 64-row
    block's also in a blocked layout 8 columns wide per thread (column pairs: wrong on the H200);
    swap_ab's in a linear layout whose first register step is one K row (right on the H200); a
    blocked layout 4 rows tall per thread; no inline asm at all."""
    tuned = _HEAD + "\n".join([_op(_DOT)] * 3)
    assert asm_layouts(tuned) == ["dot_op: pairs along dim 0"]
    bm64 = tuned + "\n" + _op("tensor<32x64xbf16, #blocked>")
    assert asm_layouts(bm64) == ["blocked: pairs along dim 1", "dot_op: pairs along dim 0"]
    swap = ("#linear = #ttg.linear<{register = [[1, 0], [0, 8], [8, 0]], lane = [[2, 0], [4, 0], [0, 1], [0, 2], "
            "[0, 4]], warp = [[0, 16], [0, 32]], block = []}>\n" + _op("tensor<32x64xbf16, #linear>"))
    assert asm_layouts(swap) == ["linear: pairs along dim 0"]
    tall = ("#blocked1 = #ttg.blocked<{sizePerThread = [4, 1], threadsPerWarp = [16, 2], warpsPerCTA = [1, 4], "
            "order = [0, 1]}>\n" + _op("tensor<32x64xbf16, #blocked1>"))
    assert asm_layouts(tall) == ["blocked: pairs along dim 0"]
    assert asm_layouts(_HEAD + "%0 = tt.dot %a, %b, %c : tensor<16x16xbf16, #blocked>") == []


def test_the_worker_imports_only_the_standard_library():
    """The pip-Triton Python that runs ptx_worker.py by path has neither JAX nor this package: the
    module's own imports are the standard library's (Triton's are inside the functions)."""
    import ast
    import sys

    from ddtree_jax.bench import ptx_worker
    tree = ast.parse(open(ptx_worker.__file__).read())
    top = {a.name.split(".")[0] for node in tree.body if isinstance(node, ast.Import) for a in node.names}
    top |= {node.module.split(".")[0] for node in tree.body if isinstance(node, ast.ImportFrom)}
    assert top and top - {"__future__"} <= set(sys.stdlib_module_names), top
