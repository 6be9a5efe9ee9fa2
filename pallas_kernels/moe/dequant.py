"""In-register INT4 -> 16-bit dequantisation of one kernel-layout word tile (shared by the kernels).

A tile `wq` int32 [32, BN] of the kernel layout holds 8 nibble planes; plane j is the K group j of
the current 256-wide K block. Values come out as `nibble - 8` exactly (the kernel applies the group scale,
to the weights or to the dot output). Two routes:
- "bits": plain lax bit ops. For bf16, the nibble is OR-ed into the bf16 pattern 0x4300 (= 128.0,
  whose mantissa step is 1), giving 128 + nibble without an int->float convert; minus 136.
- "asm" (GPU only): the same trick in PTX, two columns per 32-bit register: `prmt` gathers the byte
  of two neighbouring words, `lop3` masks a nibble of each half and ORs the exponent, one
  `fma.rn.bf16x2` subtracts 136 from both halves: 2-2.5 instructions per weight. One asm block
  per plane, emitted right before its dot, keeps one plane live at a time. With the scale, one more
  `fma.rn.bf16x2` (times s, plus -0) per two weights. float16 (`ptx.asm_source_f16`): the 0x6400
  pattern (1024.0) has a 10-bit mantissa, so a high nibble stays in place, 1024 + 16 n, and one
  `fma.rn.f16x2` by 1/16 minus 72 gives n - 8: odd planes need no shift (sm_90a PTX of the gate_up
  loop at T = 64: 742 instructions per iteration against bf16's 805). The PTX sources: ptx.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.moe.ptx import ASM, ASM_F16, ASM_F16_SCALED, ASM_SCALED
from pallas_kernels.pallas_compat import plgpu

_MAGIC = 0x4300        # bf16 128.0
_MAGIC_OFFSET = 136.0  # 128 + 8


def plane_bits(wq, j: int, dtype, s=None):
    """int32 [R, BN] -> plane j as `dtype` [R, BN] (nibble j - 8, times s [BN] when given)."""
    nib = jax.lax.shift_right_logical(wq, jnp.int32(4 * j)) & 0xF
    if dtype == jnp.bfloat16:
        v = jax.lax.bitcast_convert_type((nib | _MAGIC).astype(jnp.int16), jnp.bfloat16)
        v = v - jnp.asarray(_MAGIC_OFFSET, jnp.bfloat16)
    else:
        v = (nib - 8).astype(dtype)
    return v if s is None else v * s.astype(dtype)[None, :]


def plane_asm(wq, j: int, dtype, s=None):
    """int32 [R, BN] -> plane j as `dtype` (bf16 or float16) [R, BN] through inline PTX (two
    columns per register); times the scales s [BN] (converted to `dtype`) when given."""
    shape = [jax.ShapeDtypeStruct(wq.shape, dtype)]
    plain, scaled = (ASM_F16, ASM_F16_SCALED) if dtype == jnp.float16 else (ASM, ASM_SCALED)
    if s is None:
        (out,) = plgpu.elementwise_inline_asm(plain[j], args=[wq], constraints="=r,r,r", pack=2,
                                              result_shape_dtypes=shape)
    else:
        s = jnp.broadcast_to(s.astype(dtype)[None, :], wq.shape)
        (out,) = plgpu.elementwise_inline_asm(scaled[j], args=[wq, s], constraints="=r,r,r,r",
                                              pack=2, result_shape_dtypes=shape)
    return out


def plane(wq, j: int, dtype, route: str, s=None):
    """Plane j of a kernel-layout word tile as `dtype`, through `route` ("asm" or "bits"); times
    the group scales s [BN] when given."""
    if route == "asm":
        if dtype not in (jnp.bfloat16, jnp.float16):
            raise ValueError(f"dequant route 'asm' needs bfloat16 or float16 activations, got {dtype}")
        return plane_asm(wq, j, dtype, s)
    return plane_bits(wq, j, dtype, s)
