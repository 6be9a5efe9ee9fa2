"""In-register INT4 -> 16-bit dequantisation of one kernel-layout word tile (shared by the kernels).

A tile `wq` int32 [32, BN] holds one 256-wide K block: 8 nibble planes (plane j is the K group j of
the block), stored in row pairs (`int4.py`: word row r, r even, holds planes 0-3 of rows r and r +
1, row r + 1 planes 4-7). Values come out as `nibble - 8` exactly (the kernel applies the group
scale, to the weights or to the dot output). Two routes:
- "asm" (GPU only): PTX on two columns' worth of one register pair: the MMA's B operand holds K rows
  (r, r + 1) of a column in one register, and the kernel-layout words of those rows hold each plane's
  two nibbles 16 bits apart, so `lop3` masks both and ORs the exponent pattern in one instruction.
  bf16: 0x4300 (128.0, mantissa step 1) gives 128 + n, one `fma.rn.bf16x2` subtracts 136; planes
  1-3 and 5-7 shift first. float16: the 0x6400 pattern (1024.0) has a 10-bit mantissa, so a nibble at
  bit 4 stays in place, 1024 + 16 n, and one `fma.rn.f16x2` by 1/16 minus 72 gives n - 8; only
  planes 2, 3, 6, 7 shift (by 8, once for both in the compiled loop). With the group scale (the
  kernels' `scale_weights`), the fused forms instead: the nibble masked alone is a 16-bit subnormal,
  and one fma with a per-plane multiplier and offset made from the scale gives (nibble - 8) * s *
  2^-M (`fused_factors`); the kernels multiply their float32 sums by 2^M (`FUSED_UNDO`). Two
  instructions per two weights in place of three (plus the shifts). One asm block per plane,
  emitted right before its dot, keeps one plane live at a time. The sources: ptx.py.
  The register pair being K rows (r, r + 1) of one column holds for mma.sync's operands (blocks of
  16-32 rows) and for wgmma's register operand (swap_ab), not for the shared-memory weight tile
  Triton gives wgmma for blocks of 64 rows or more (there a register pair is two columns of one
  row), so `MoEConfig.check` refuses "asm" with bm >= 64.
- "bits": plain lax bit ops on each element, which needs the word of its row pair's other row too
  (`partner`, the tile with rows r and r ^ 1 swapped; `row_words` sorts each row's 16 bits out of
  the two once per K block). For bf16, the nibble is OR-ed into 0x4300, giving 128 + nibble
  without an int->float convert; minus 136.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.moe.ptx import ASM, ASM_F16, ASM_FUSED, ASM_FUSED_F16, FUSED_M, fused_multiplier_exponent
from pallas_kernels.pallas_compat import plgpu

# what the fused forms' float32 sums are multiplied by, per activation dtype
FUSED_UNDO = {jnp.dtype(jnp.bfloat16): 2.0 ** FUSED_M["bfloat16"], jnp.dtype(jnp.float16): 2.0 ** FUSED_M["float16"]}

_MAGIC = 0x4300        # bf16 128.0
_MAGIC_OFFSET = 136.0  # 128 + 8


def row_words(wq, partner):
    """Kernel-layout word tile [R, BN] (R even, from an even row) and its row-pair partner (rows
    r ^ 1) -> (w03, w47) int32 [R, BN]: each row's 16 bits of planes 0-3 and of planes 4-7 in the
    low half (plane j at bit 4 (j % 4)). Row r's planes 0-3 live in word row r & ~1, 4-7 in r | 1,
    in the half r % 2. Once per K block; `plane_bits` then needs one shift and mask per plane."""
    odd = jax.lax.broadcasted_iota(jnp.int32, wq.shape, 0) % 2
    half = 16 * odd
    w03 = jax.lax.shift_right_logical(jnp.where(odd == 1, partner, wq), half)
    w47 = jax.lax.shift_right_logical(jnp.where(odd == 1, wq, partner), half)
    return w03, w47


def plane_bits(words, j: int, dtype, s=None):
    """`row_words`' (w03, w47) -> plane j as `dtype` [R, BN] (nibble - 8, times s [BN] when given)."""
    nib = jax.lax.shift_right_logical(words[j // 4], jnp.int32(4 * (j % 4))) & 0xF
    if dtype == jnp.bfloat16:
        v = jax.lax.bitcast_convert_type((nib | _MAGIC).astype(jnp.int16), jnp.bfloat16)
        v = v - jnp.asarray(_MAGIC_OFFSET, jnp.bfloat16)
    else:
        v = (nib - 8).astype(dtype)
    return v if s is None else v * s.astype(dtype)[None, :]


def fused_factors(s, j: int, dtype):
    """Group scales s [BN] of plane j -> the fused forms' (multiplier, offset) [BN] in `dtype`
    (bf16 or float16): s * 2^(E - b - M) and -8 s 2^-M (ptx.FUSED_M), exact powers of two."""
    name = jnp.dtype(dtype).name
    f = s.astype(jnp.float32)
    return ((f * 2.0 ** fused_multiplier_exponent(j, name)).astype(dtype),
            (f * (-8.0 * 2.0 ** -FUSED_M[name])).astype(dtype))


def plane_asm(wq, j: int, dtype, s=None):
    """int32 [R, BN] -> plane j as `dtype` (bf16 or float16) [R, BN] through inline PTX (one
    register pair of rows r, r + 1 per call): nibble - 8, or with the scales s [BN] the fused
    (nibble - 8) * s * 2^-M (the caller multiplies its float32 sums by FUSED_UNDO[dtype])."""
    shape = [jax.ShapeDtypeStruct(wq.shape, dtype)]
    f16 = dtype == jnp.float16
    if s is None:
        (out,) = plgpu.elementwise_inline_asm((ASM_F16 if f16 else ASM)[j], args=[wq], constraints="=r,r,r",
                                              pack=2, result_shape_dtypes=shape)
    else:
        mult, off = (jnp.broadcast_to(v[None, :], wq.shape) for v in fused_factors(s, j, dtype))
        (out,) = plgpu.elementwise_inline_asm((ASM_FUSED_F16 if f16 else ASM_FUSED)[j], args=[wq, mult, off],
                                              constraints="=r,r,r,r,r", pack=2, result_shape_dtypes=shape)
    return out


def plane(wq, j: int, dtype, route: str, s=None, words=None):
    """Plane j of a kernel-layout word tile as `dtype`, through `route` ("asm", or "bits", which
    takes the tile's `row_words` as `words`); times the group scales s [BN] when given ("asm":
    times 2^-M as well, `plane_asm`)."""
    if route == "asm":
        if dtype not in (jnp.bfloat16, jnp.float16):
            raise ValueError(f"dequant route 'asm' needs bfloat16 or float16 activations, got {dtype}")
        return plane_asm(wq, j, dtype, s)
    if words is None:
        raise ValueError("dequant route 'bits' needs the tile's row_words")
    return plane_bits(words, j, dtype, s)
