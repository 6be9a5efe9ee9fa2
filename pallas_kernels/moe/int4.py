"""INT4 W4A16 weights: compressed-tensors pack-quantized format and the kernels' layout.

compressed-tensors (HF, `[out N, in K]`): symmetric, group 32 along K; `packed` int32 [..., N, K/8]
holds 8 nibbles per word, lowest K index in the lowest nibble, value = nibble - 8; `scale` bf16
[..., N, K/32].

Kernel layout (`[in, out]`, K padded to a multiple of KBLOCK=256 with zero weights and scales):
`qweight` int32 [..., Kp/8, N], `qscale` bf16 or float16 [..., Kp/32, N] (float16: the Pallas
kernels multiply in float16, `pallas_triton.f16_compute`). Within one 256-wide K block kb, nibble
plane j (K group kb*8 + j) is a [32, N] slab, row r = K index kb*256 + j*32 + r, and a kernel turns
each plane into one [32, N] 16-bit slab and one K=32 dot, applying that group's scale to the slab
or to the dot output (`MoEConfig.scale_weights`). The 32 word rows of block kb hold those slabs in
row pairs (r, r + 1), r even: word row kb*32 + r holds planes 0-3 of rows r (bits 0-15, plane j at
bit 4j) and r + 1 (bits 16-31), word row kb*32 + r + 1 planes 4-7 the same way. A kernel's MMA
takes B in registers holding K rows (r, r + 1) of one column, so each plane's two values are one
mask apart in a single word (`ptx.py`): no byte gathering (PRMT) between the two words.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.checks import concrete
from pallas_kernels.moe.ptx import FUSED_M

SCALE_DTYPES = (jnp.bfloat16, jnp.float16)
# Version of the kernel layout below; saved with Orbax checkpoints of converted experts
# (1: each word one column's 8 planes; 2: planes 0-3 / 4-7 of a row pair per word).
LAYOUT_VERSION = 2
GROUP = 32
KBLOCK = 256          # K block of the kernel layout: 8 nibble planes x 32 rows
PLANE = KBLOCK // 8   # rows per nibble plane == GROUP
# A K block's nibbles [plane j = 4s + q, row r = 2i + h] sit at word row 2i + s, nibble 4h + q:
# axes (s, q, i, h) of the K block <-> (i, s) word rows x (h, q) nibbles of a word.
_BLOCK = (2, 4, PLANE // 2, 2)

_SHIFTS = np.arange(8, dtype=np.uint32) * 4   # numpy: importing must not start a JAX backend


def _check_k(k: int, name: str) -> None:
    if k % GROUP:
        raise ValueError(f"{name}: input dim K={k} must be a multiple of the group size {GROUP}")


def padded_k(k: int) -> int:
    """K rounded up to the kernel layout's K block."""
    return -(-k // KBLOCK) * KBLOCK


def _unpack(packed):
    """int32 [..., W] -> uint32 nibbles [..., W*8] (lowest nibble first)."""
    u = jax.lax.bitcast_convert_type(packed, jnp.uint32)
    nib = (u[..., None] >> _SHIFTS) & 0xF
    return nib.reshape(*packed.shape[:-1], packed.shape[-1] * 8)


def _pack(nib):
    """uint32 nibbles [..., W*8] -> int32 [..., W] (lowest nibble first)."""
    nib = nib.reshape(*nib.shape[:-1], nib.shape[-1] // 8, 8).astype(jnp.uint32)
    word = jnp.bitwise_or.reduce(nib << _SHIFTS, axis=-1)
    return jax.lax.bitcast_convert_type(word, jnp.int32)


@jax.jit
def quantize_int4(w):
    """w float [..., N, K] -> (packed int32 [..., N, K/8], scale bf16 [..., N, K/32]).

    Symmetric group-32 quantisation as compressed-tensors: scale = absmax / 7.5 (rounded to bf16),
    q = clip(round(w / scale), -8, 7), stored as q + 8.
    """
    _check_k(w.shape[-1], "w")
    g = w.astype(jnp.float32).reshape(*w.shape[:-1], w.shape[-1] // GROUP, GROUP)
    scale = (jnp.max(jnp.abs(g), axis=-1) / 7.5).astype(jnp.bfloat16)
    s = scale.astype(jnp.float32)[..., None]
    q = jnp.clip(jnp.round(g / jnp.where(s == 0, 1.0, s)), -8, 7)
    nib = (q + 8).astype(jnp.uint32).reshape(w.shape)
    return _pack(nib), scale


@jax.jit
def dequantize_int4(packed, scale):
    """(packed int32 [..., N, K/8], scale [..., N, K/32]) -> float32 [..., N, K]."""
    if packed.dtype != jnp.int32:
        raise ValueError(f"packed: expected int32, got {packed.dtype}")
    if scale.shape[:-1] != packed.shape[:-1] or scale.shape[-1] * 4 != packed.shape[-1]:
        raise ValueError(f"scale: shape {scale.shape} does not match packed {packed.shape}")
    q = _unpack(packed).astype(jnp.float32) - 8.0
    q = q.reshape(*scale.shape, GROUP)
    return (q * scale.astype(jnp.float32)[..., None]).reshape(*packed.shape[:-1], -1)


def _to_kernel_one(packed, scale, scale_dtype):
    """One matrix: HF (packed [N, K/8], scale [N, K/32]) -> (qweight [Kp/8, N], qscale [Kp/32, N])."""
    n, k = packed.shape[0], packed.shape[1] * 8
    kp = padded_k(k)
    nib = jnp.pad(_unpack(packed), ((0, 0), (0, kp - k)), constant_values=8)
    # [N, Kp] = [N, kb, s, q, i, h] -> words [kb, i, s, N] of nibbles (h, q)
    nib = nib.reshape(n, kp // KBLOCK, *_BLOCK).transpose(1, 4, 2, 0, 5, 3)
    qweight = _pack(nib.reshape(kp // 8, n * 8))
    qscale = jnp.pad(scale.astype(scale_dtype).T, ((0, (kp - k) // GROUP), (0, 0)))
    return qweight, qscale


def _block_nibbles(qweight):
    """qweight [..., Kp/8, N] -> nibbles [..., kb, s, q, i, h, N] (K index kb*256 + (4s+q)*32 + 2i+h)."""
    *lead, w, n = qweight.shape
    words = qweight.reshape(*lead, w // PLANE, PLANE // 2, 2, n)            # [.., kb, i, s, N]
    nib = _unpack(words).reshape(*lead, w // PLANE, PLANE // 2, 2, n, 2, 4)   # [.., kb, i, s, N, h, q]
    b = len(lead)
    return nib.transpose(*range(b), b, b + 2, b + 5, b + 1, b + 4, b + 3)


def _to_hf_one(qweight, qscale, k):
    """Inverse of `_to_kernel_one` for one matrix; `k` is the unpadded input dim."""
    kp, n = qweight.shape[0] * 8, qweight.shape[1]
    nib = jnp.moveaxis(_block_nibbles(qweight), -1, 0).reshape(n, kp)
    return _pack(nib[:, :k]), qscale[: k // GROUP].T


def _check_hf_pair(packed, scale, name):
    if packed.ndim != 3 or packed.dtype != jnp.int32:
        raise ValueError(f"{name}_packed: expected int32 [E, N, K/8], got {packed.dtype} {packed.shape}")
    e, n, w = packed.shape
    if scale.shape != (e, n, w // 4):
        raise ValueError(f"{name}_scale: expected shape {(e, n, w // 4)}, got {scale.shape}")
    _check_k(w * 8, f"{name}_packed")


def scale_range(scale_dtype) -> tuple[float, float]:
    """[lo, hi): the magnitudes nonzero group scales of `scale_dtype` may take in the kernel layout.
    float16: its normal numbers (where a bf16 scale converts exactly) below 2^(M - 8) = 2^-2;
    bfloat16: below 2^(M - 5) = 2^27. M: ptx.FUSED_M, whose fused dequantisation needs the
    multiplier s * 2^(E - M) finite (E = 24 / 133). (bf16 scales below 2^-94 put its products under
    bf16's normal range, an absolute error below 2^-91 per weight: allowed.)"""
    m = FUSED_M[jnp.dtype(scale_dtype).name]
    return (2.0 ** -14, 2.0 ** (m - 8)) if scale_dtype == jnp.float16 else (0.0, 2.0 ** (m - 5))


def check_scales(scale, scale_dtype, name: str = "w") -> None:
    """Raise ValueError unless every nonzero scale's magnitude lies in `scale_range(scale_dtype)`.
    Skipped under a trace."""
    lo, hi = scale_range(scale_dtype)
    a = jnp.abs(jnp.asarray(scale).astype(jnp.float32))
    bad = concrete(jnp.any((a != 0) & ((a < lo) | (a >= hi))))
    if bad is not None and bool(bad):
        what = jnp.dtype(scale_dtype).name
        hint = "; keep bfloat16 scales" if scale_dtype == jnp.float16 else ""
        raise ValueError(f"{name}_scale: values outside [{lo:.3g}, {hi:.3g}), the range {what} scales may "
                         f"take (int4.scale_range: exact in {what}, finite in the kernels' fused "
                         f"dequantisation){hint}")


def to_kernel_layout(packed, scale, name: str = "w", scale_dtype=jnp.bfloat16):
    """Stacked experts: (packed int32 [E, N, K/8], scale [E, N, K/32]) ->
    (qweight int32 [E, Kp/8, N], qscale scale_dtype [E, Kp/32, N]); one expert at a time on the
    device. scale_dtype: bfloat16 or float16; the scales are checked against `scale_range`."""
    _check_hf_pair(packed, scale, name)
    if scale_dtype not in SCALE_DTYPES:
        raise ValueError(f"{name}: scale_dtype must be bfloat16 or float16, got {jnp.dtype(scale_dtype).name}")
    check_scales(scale, scale_dtype, name)
    return _to_kernel_stacked(packed, scale, jnp.dtype(scale_dtype))


@functools.partial(jax.jit, static_argnums=2)
def _to_kernel_stacked(packed, scale, scale_dtype):
    return jax.lax.map(lambda a: _to_kernel_one(*a, scale_dtype), (packed, scale))


@functools.partial(jax.jit, static_argnums=2)
def from_kernel_layout(qweight, qscale, k: int):
    """Inverse of `to_kernel_layout` (bit-exact); `k` is the unpadded input dim."""
    return jax.lax.map(lambda a: _to_hf_one(*a, k), (qweight, qscale))


def dequantize_kernel_layout(qweight, qscale, dtype=jnp.float32):
    """Kernel layout (qweight [..., Kp/8, N], qscale [..., Kp/32, N]) -> dtype [..., Kp, N]."""
    *lead, w, n = qweight.shape
    q = _block_nibbles(qweight).reshape(*lead, w * 8, n).astype(jnp.float32) - 8.0
    s = jnp.repeat(qscale.astype(jnp.float32), GROUP, axis=-2)
    return (q * s).astype(dtype)
