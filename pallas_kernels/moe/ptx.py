"""The PTX of the INT4 -> 16-bit dequantisation (the "asm" route), as plain strings: no JAX here,
so the raw Triton kernels and offline tools can import it. Each source turns plane j of the two
kernel-layout words of one row pair ($1: word row r, $2: word row r + 1, r even; `int4.py`) into the
plane's two 16-bit values at rows r and r + 1 ($0, row r in the low half). Planes 0-3 are in $1, 4-7
in $2, each plane's two nibbles 16 bits apart, so one `lop3` / `and` masks both.
- `asm_source` (bf16) and `asm_source_f16` give `nibble - 8` exactly: the mask ORs in an exponent
  pattern (128.0 or 1024.0), one fma or add removes its offset. For kernels that scale each
  plane's float32 dot output.
- `asm_source_fused` gives (nibble - 8) * s * 2^-M with the group scale s in one fma: the masked
  nibble alone is a subnormal (`FUSED_M` has the arithmetic). For kernels that scale the weights.
Only planes whose nibbles lie above the type's mantissa field shift first.
"""

from __future__ import annotations


def _word(j: int) -> str:
    return "$1" if j < 4 else "$2"


def asm_source(j: int) -> str:
    """PTX for plane j of a word pair ($1, $2) -> bf16x2 ($0) = n - 8: 128 + n from the 0x4300
    pattern (7-bit mantissa: nibble at bit 0), minus 136."""
    lines = ["{", ".reg .b32 q, one, off;", "mov.b32 one, 0x3F803F80;", "mov.b32 off, 0xC308C308;"]
    src = _word(j)
    if j % 4:
        lines.append(f"shr.u32 q, {src}, {4 * (j % 4)};")
        src = "q"
    lines += [f"lop3.b32 $0, {src}, 0x000F000F, 0x43004300, 0xEA;", "fma.rn.bf16x2 $0, $0, one, off;"]
    return "\n".join(lines + ["}"])


def asm_source_f16(j: int) -> str:
    """PTX for plane j of a word pair ($1, $2) -> f16x2 ($0) = n - 8. The 0x6400 pattern (1024.0, 10-bit mantissa) holds a nibble at bit 0 or bit 4: nibble at bit 0:
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
    return "\n".join(lines + ["}"])


# The fused forms. A nibble masked in place, with no exponent pattern, read as a 16-bit float is
# n * 2^(b - E): E = 24 (float16) or 133 (bf16), b its bit, 0 or 4 (odd planes). At b = 4 a bf16
# nibble reaches the exponent field's lowest bit, where the encoding is still linear (the first
# normal binade continues the subnormals' spacing). One fma with the multiplier s * 2^(E - b - M)
# and the offset -8 s 2^-M gives (n - 8) s 2^-M rounded once: the unfused (n - 8) * s times 2^-M,
# bit for bit while that product is a normal number, and the kernels undo 2^-M on their float32
# sums (exact). M keeps the multiplier finite and the products normal: bf16 M = 32 (scales below
# 2^27; products normal from 2^-94); float16 M = 6 (the multiplier s * 2^18 is finite for scales below 2^-2, the
# products normal for scales >= 2^-8; below, small products, and below 2^-11 the offset, round
# as float16 subnormals: an absolute error of at most 2^-18 per weight). `int4.scale_range`.
FUSED_M = {"float16": 6, "bfloat16": 32}
_FUSED_E = {"float16": 24, "bfloat16": 133}


def fused_multiplier_exponent(j: int, dtype: str) -> int:
    """log2(plane j's multiplier / its scale) in the fused forms; dtype "float16" or "bfloat16"."""
    return _FUSED_E[dtype] - 4 * (j % 2) - FUSED_M[dtype]


def asm_source_fused(j: int, dtype: str) -> str:
    """PTX for plane j of a word pair ($1, $2) -> 16-bit x2 ($0) = nibble * $3 + $4, with $3 the
    plane's multiplier and $4 its offset (x2, `dtype`). Planes j % 4 = 2, 3 shift by 8 first."""
    src = _word(j)
    lines = ["{", ".reg .b32 q;"]
    if j % 4 >= 2:
        lines.append(f"shr.u32 q, {src}, 8;")
        src = "q"
    kind = "f16x2" if dtype == "float16" else "bf16x2"
    lines += [f"and.b32 $0, {src}, {'0x00F000F0' if j % 2 else '0x000F000F'};", f"fma.rn.{kind} $0, $0, $3, $4;"]
    return "\n".join(lines + ["}"])


ASM = tuple(asm_source(j) for j in range(8))
ASM_F16 = tuple(asm_source_f16(j) for j in range(8))
ASM_FUSED = tuple(asm_source_fused(j, "bfloat16") for j in range(8))
ASM_FUSED_F16 = tuple(asm_source_fused(j, "float16") for j in range(8))
