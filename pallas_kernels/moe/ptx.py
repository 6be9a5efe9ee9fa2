"""The PTX of the INT4 -> 16-bit dequantisation (the "asm" route), as plain strings: no JAX here,
so the raw Triton kernels and offline tools can import it. Each source turns plane j of the two
kernel-layout words of one row pair ($1: word row r, $2: word row r + 1, r even; `int4.py`) into the
plane's two 16-bit values at rows r and r + 1 ($0, row r in the low half), `nibble - 8`, times the
x2 scales ($3) in the scaled forms. Planes 0-3 are in $1, 4-7 in $2, each plane's two nibbles 16
bits apart, so one `lop3` masks both and ORs in the exponent; only the planes whose nibbles lie
above the 16-bit type's mantissa field need a shift first. `dequant.py` describes the scheme.
"""

from __future__ import annotations


def _word(j: int) -> str:
    return "$1" if j < 4 else "$2"


def asm_source(j: int, scaled: bool = False) -> str:
    """PTX for plane j of a word pair ($1, $2) -> bf16x2 ($0); scaled: times $3 (bf16x2).
    128 + n from the 0x4300 pattern (7-bit mantissa: nibble at bit 0), minus 136."""
    lines = ["{", ".reg .b32 q, one, off;", "mov.b32 one, 0x3F803F80;", "mov.b32 off, 0xC308C308;"]
    src = _word(j)
    if j % 4:
        lines.append(f"shr.u32 q, {src}, {4 * (j % 4)};")
        src = "q"
    lines += [f"lop3.b32 $0, {src}, 0x000F000F, 0x43004300, 0xEA;", "fma.rn.bf16x2 $0, $0, one, off;"]
    if scaled:   # (nibble - 8) is exact in bf16; one rounding of its product with s (+ -0.0)
        lines += ["mov.b32 off, 0x80008000;", "fma.rn.bf16x2 $0, $0, $3, off;"]
    return "\n".join(lines + ["}"])


def asm_source_f16(j: int, scaled: bool = False) -> str:
    """PTX for plane j of a word pair ($1, $2) -> f16x2 ($0); scaled: times $3 (f16x2).
    The 0x6400 pattern (1024.0, 10-bit mantissa) holds a nibble at bit 0 or bit 4: nibble at bit 0:
    (1024 + n) - 1032; at bit 4: (1024 + 16 n) / 16 - 72; both exact. Planes j % 4 = 2, 3 shift by 8."""
    lines = ["{", ".reg .b32 q, m, c;"]
    src = _word(j)
    if j % 4 >= 2:
        lines.append(f"shr.u32 q, {src}, 8;")
        src = "q"
    lines.append(f"lop3.b32 $0, {src}, {'0x00F000F0' if j % 2 else '0x000F000F'}, 0x64006400, 0xEA;")
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
