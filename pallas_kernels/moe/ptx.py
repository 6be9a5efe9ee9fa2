"""The PTX of the INT4 -> 16-bit dequantisation (the "asm" route), as plain strings: no JAX here,
so the raw Triton kernels and offline tools can import it. Each source turns plane j of two
neighbouring kernel-layout words ($1, $2) into two 16-bit values ($0, the first in the low half),
`nibble - 8`, times the x2 scales ($3) in the scaled forms. `dequant.py` describes the scheme.
"""

from __future__ import annotations


def asm_source(j: int, scaled: bool = False) -> str:
    """PTX for plane j of two neighbouring words ($1, $2) -> bf16x2 ($0); scaled: times $3 (bf16x2)."""
    lines = ["{", ".reg .b32 q, one, off;", "mov.b32 one, 0x3F803F80;", "mov.b32 off, 0xC308C308;",
             f"prmt.b32 q, $1, $2, 0x{(4 + j // 2) << 8 | j // 2:04x};"]
    if j % 2:
        lines.append("shr.u32 q, q, 4;")
    lines += ["lop3.b32 $0, q, 0x000F000F, 0x43004300, 0xEA;", "fma.rn.bf16x2 $0, $0, one, off;"]
    if scaled:   # (nibble - 8) is exact in bf16; one rounding of its product with s (+ -0.0)
        lines += ["mov.b32 off, 0x80008000;", "fma.rn.bf16x2 $0, $0, $3, off;"]
    return "\n".join(lines + ["}"])


def asm_source_f16(j: int, scaled: bool = False) -> str:
    """PTX for plane j of two neighbouring words ($1, $2) -> f16x2 ($0); scaled: times $3 (f16x2).
    Even j: (1024 + n) - 1032; odd j: (1024 + 16 n) / 16 - 72; both exact."""
    lines = ["{", ".reg .b32 q, m, c;", f"prmt.b32 q, $1, $2, 0x{(4 + j // 2) << 8 | j // 2:04x};",
             f"lop3.b32 $0, q, {'0x00F000F0' if j % 2 else '0x000F000F'}, 0x64006400, 0xEA;"]
    if j % 2:
        lines += ["mov.b32 m, 0x2C002C00;", "mov.b32 c, 0xD480D480;", "fma.rn.f16x2 $0, $0, m, c;"]
    else:
        lines += ["mov.b32 c, 0xE408E408;", "add.rn.f16x2 $0, $0, c;"]
    if scaled:
        lines.append("mul.rn.f16x2 $0, $0, $3;")
    return "\n".join(lines + ["}"])


ASM = tuple(asm_source(j) for j in range(8))
ASM_SCALED = tuple(asm_source(j, True) for j in range(8))
ASM_F16 = tuple(asm_source_f16(j) for j in range(8))
ASM_F16_SCALED = tuple(asm_source_f16(j, True) for j in range(8))
