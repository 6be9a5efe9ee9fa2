"""In-register INT4 -> 16-bit dequantisation of one kernel-layout word tile (shared by the kernels).

A tile `wq` int32 [32, BN] of the kernel layout holds 8 nibble planes; plane j is the K group j of
the current 256-wide K block. Values come out as `nibble - 8` exactly (the group scale is applied to
the dot output). Two routes:
- "bits": plain lax bit ops. For bf16, the nibble is OR-ed into the bf16 pattern 0x4300 (= 128.0,
  whose mantissa step is 1), giving 128 + nibble without an int->float convert; minus 136.
- "asm" (GPU only): the same trick in PTX, two columns per 32-bit register: `prmt` gathers the byte
  of two neighbouring words, `lop3` masks a nibble of each half and ORs the exponent, one
  `fma.rn.bf16x2` subtracts 136 from both halves: 2-2.5 instructions per weight. One asm block
  per plane, emitted right before its dot, keeps one plane live at a time.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.pallas_compat import plgpu

_MAGIC = 0x4300        # bf16 128.0
_MAGIC_OFFSET = 136.0  # 128 + 8


def plane_bits(wq, j: int, dtype):
    """int32 [R, BN] -> plane j as `dtype` [R, BN] (nibble j - 8)."""
    nib = jax.lax.shift_right_logical(wq, jnp.int32(4 * j)) & 0xF
    if dtype == jnp.bfloat16:
        v = jax.lax.bitcast_convert_type((nib | _MAGIC).astype(jnp.int16), jnp.bfloat16)
        return v - jnp.asarray(_MAGIC_OFFSET, jnp.bfloat16)
    return (nib - 8).astype(dtype)


def asm_source(j: int) -> str:
    """PTX for plane j of two neighbouring words ($1, $2) -> bf16x2 ($0)."""
    lines = ["{", ".reg .b32 q, one, off;", "mov.b32 one, 0x3F803F80;", "mov.b32 off, 0xC308C308;",
             f"prmt.b32 q, $1, $2, 0x{(4 + j // 2) << 8 | j // 2:04x};"]
    if j % 2:
        lines.append("shr.u32 q, q, 4;")
    lines += ["lop3.b32 $0, q, 0x000F000F, 0x43004300, 0xEA;", "fma.rn.bf16x2 $0, $0, one, off;", "}"]
    return "\n".join(lines)


ASM = tuple(asm_source(j) for j in range(8))


def plane_asm(wq, j: int):
    """int32 [R, BN] -> plane j as bf16 [R, BN] through inline PTX (two columns per register)."""
    (out,) = plgpu.elementwise_inline_asm(
        ASM[j], args=[wq], constraints="=r,r,r", pack=2,
        result_shape_dtypes=[jax.ShapeDtypeStruct(wq.shape, jnp.bfloat16)])
    return out


def plane(wq, j: int, dtype, route: str):
    """Plane j of a kernel-layout word tile as `dtype`, through `route` ("asm" or "bits")."""
    if route == "asm":
        if dtype != jnp.bfloat16:
            raise ValueError(f"dequant route 'asm' needs bfloat16 activations, got {dtype}")
        return plane_asm(wq, j)
    return plane_bits(wq, j, dtype)
