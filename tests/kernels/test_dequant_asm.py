"""The INT4 dequantisation PTX (pallas_kernels.moe.ptx, GPU-only "asm" route) run on the CPU by
a small interpreter of the instructions it uses, against the nibble arithmetic it replaces.

Operand convention of `elementwise_inline_asm(..., pack=2)`: $0 is the output register (two bf16
or float16, the first element in the low half), $1 and $2 the kernel-layout words of one row pair
(rows r, r + 1 of a K block's word tile), $3 and $4 the x2 multipliers and offsets (fused forms).
The interpreter's fma is exact in float64 and rounds once to the 16-bit type, subnormals included,
as the PTX manual defines fma.rn without .ftz; the GPU tests of test_moe_kernels check the hardware. The expected values
come from the row pair's plane words L0, L1 (nibble j = plane j, the plain nibble
arithmetic), stored as `int4.py` documents: $1 = L0[0:16] | L1[0:16] << 16, $2 = L0[16:32] | L1[16:32] << 16.
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

from pallas_kernels.moe.dequant import fused_factors
from pallas_kernels.moe.ptx import ASM, ASM_F16, ASM_FUSED, ASM_FUSED_F16, FUSED_M
from tests.kernel_testing import fresh_rng

BF16 = ml_dtypes.bfloat16
M32 = 0xFFFFFFFF


def _halves(x: int, dtype=BF16) -> np.ndarray:
    return np.array([x & 0xFFFF, x >> 16], np.uint16).view(dtype).astype(np.float64)


def _pack(v: np.ndarray, dtype=BF16) -> int:
    lo, hi = v.astype(dtype).view(np.uint16).astype(int)   # float64 -> 16 bits: one RNE rounding
    return int(lo) | int(hi) << 16


def run_ptx(src: str, args: list[int]) -> int:
    """Interpret the PTX block `src` with $1.. = args (32-bit); returns $0."""
    regs = {f"${i + 1}": a & M32 for i, a in enumerate(args)}
    val = lambda t: regs[t] if t in regs else int(t, 0) & M32   # noqa: E731
    for line in src.splitlines():
        line = line.strip().rstrip(";")
        if line in ("{", "}") or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        d, *ops = [t.strip() for t in rest.split(",")]
        if op == "mov.b32":
            out = val(ops[0])
        elif op == "shr.u32":
            out = val(ops[0]) >> val(ops[1])
        elif op == "and.b32":
            out = val(ops[0]) & val(ops[1])
        elif op == "lop3.b32":     # LUT over (a, b, c) = (0xF0, 0xCC, 0xAA) bit patterns
            a, b, c, lut = (val(t) for t in ops)
            out = 0
            for bit in range(32):
                idx = (a >> bit & 1) << 2 | (b >> bit & 1) << 1 | (c >> bit & 1)
                out |= (lut >> idx & 1) << bit
        elif op in ("fma.rn.bf16x2", "fma.rn.f16x2", "add.rn.f16x2", "mul.rn.f16x2"):
            # exact in float64 (16-bit operands), one rounding
            dt = BF16 if op.endswith("bf16x2") else np.float16
            a, b, *c = (_halves(val(t), dt) for t in ops)
            out = _pack({"fma": lambda: a * b + c[0], "add": lambda: a + b, "mul": lambda: a * b}[op[:3]](), dt)
        else:
            raise AssertionError(f"instruction not modelled: {op}")
        assert re.fullmatch(r"\$0|[a-z]+", d), d
        regs[d] = out & M32
    return regs["$0"]


def _stored(l0: int, l1: int) -> list[int]:
    """Plane words of rows r, r + 1 -> the two kernel-layout words ($1, $2)."""
    l0, l1 = l0 & M32, l1 & M32
    return [(l0 & 0xFFFF) | (l1 & 0xFFFF) << 16, l0 >> 16 | (l1 >> 16) << 16]


def _nibbles(l0: int, l1: int, j: int) -> np.ndarray:
    return np.array([((w & M32) >> 4 * j & 0xF) - 8 for w in (l0, l1)], np.float64)


def _words(rng):
    words = rng.integers(-2**31, 2**31, size=(64, 2), dtype=np.int64)
    words[0] = (0x88888888 - 2**32, 0x77777777)      # n = 8 (zero) and n = 7 in every plane
    words[1] = (0, -1)                                # n = 0 and n = 15
    return words


@pytest.mark.parametrize("dtype", [BF16, np.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("j", range(8))
def test_plane_asm_matches_nibbles(j, dtype):
    """n - 8 exactly: bf16 128 + n minus 136; float16 with the nibble at bit 4 (1024 + 16 n) / 16 - 72."""
    for l0, l1 in _words(fresh_rng()):
        got = _halves(run_ptx((ASM if dtype == BF16 else ASM_F16)[j], _stored(int(l0), int(l1))), dtype)
        np.testing.assert_array_equal(got, _nibbles(int(l0), int(l1), j))


# scales per dtype: bf16 across its whole range (int4.scale_range); float16 below 2^-2, from where the
# products are normal (>= 2^-8) down to where they round as subnormals (float16's smallest normal)
_FUSED_SCALES = {"bf16": [2.0 ** -94, 1e-20, 3e-3, 0.7, 1e6, 2.0 ** 27 * (1 - 2 ** -8)],
                 "f16": [2.0 ** -14, 1e-4, 2.0 ** -8, 3e-3, 0.1, 0.2498779296875]}


@pytest.mark.parametrize("dtype", [BF16, np.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("j", range(8))
def test_plane_asm_fused_matches_nibbles(j, dtype):
    """The fused forms: (n - 8) * s * 2^-M rounded once to the 16-bit type, i.e. the unfused
    product times 2^-M, with the multiplier and offset of dequant.fused_factors (exact)."""
    import jax.numpy as jnp

    name = "bf16" if dtype == BF16 else "f16"
    m = FUSED_M["bfloat16" if dtype == BF16 else "float16"]
    rng = fresh_rng()
    jdt = jnp.bfloat16 if dtype == BF16 else jnp.float16
    for scale in _FUSED_SCALES[name]:
        s = np.array([scale, scale * (1 - 2.0 ** -7) * rng.choice([1, -1])]).astype(dtype)
        mult, off = (np.asarray(v).astype(dtype) for v in fused_factors(jnp.asarray(s, jdt), j, jdt))
        s64 = s.astype(np.float64)
        b = 4 * (j % 2)
        np.testing.assert_array_equal(mult.astype(np.float64), s64 * 2.0 ** ({BF16: 133}.get(dtype, 24) - b - m))
        exact_off = bool(np.all(off.astype(np.float64) == -8 * s64 * 2.0 ** -m))   # float16: from s >= 2^-11
        assert exact_off or (dtype == np.float16 and abs(scale) < 2.0 ** -11)
        for l0, l1 in _words(rng)[:16]:
            nib = _nibbles(int(l0), int(l1), j)
            src = (ASM_FUSED if dtype == BF16 else ASM_FUSED_F16)[j]
            got = _halves(run_ptx(src, [*_stored(int(l0), int(l1)), _pack(mult.astype(np.float64), dtype),
                                        _pack(off.astype(np.float64), dtype)]), dtype)
            if exact_off:
                np.testing.assert_array_equal(got, (nib * s64 * 2.0 ** -m).astype(dtype).astype(np.float64))
            if dtype == BF16 or abs(scale) >= 2.0 ** -8:    # products normal: the unfused product, times 2^-M
                np.testing.assert_array_equal(got * 2.0 ** m, (nib * s64).astype(dtype).astype(np.float64))
            else:   # float16 products (and below 2^-11 offsets) that round as subnormals: within 2^(M-24)
                exact = nib * s64
                assert np.all(np.abs(got * 2.0 ** m - exact) <= np.maximum(np.abs(exact) * 2.0 ** -11, 2.0 ** (m - 24)))


def test_no_byte_gathering():
    """Each plane reads one of the two words and needs at most one shift before its mask."""
    for src in ASM + ASM_F16 + ASM_FUSED + ASM_FUSED_F16:
        assert "prmt" not in src and src.count("shr.u32") <= 1 and ("$1" in src) != ("$2" in src)


def test_fused_forms_are_two_instructions():
    """A fused plane is a mask and one fma (plus the shift of planes 2, 3, 6, 7)."""
    for j, src in enumerate(ASM_FUSED + ASM_FUSED_F16):
        ops = [ln.split()[0] for ln in src.splitlines() if ln.strip() not in ("{", "}") and not ln.startswith(".reg")]
        assert ops == ["shr.u32"] * ((j % 8) % 4 >= 2) + ["and.b32", ops[-1]] and ops[-1].startswith("fma.rn.")


def test_interpreter_primitives():
    """lop3 and shr as the PTX manual defines them, on hand-checked values."""
    assert run_ptx("lop3.b32 $0, $1, $2, $3, 0xEA;", [0xF0F0, 0x0FF0, 0x000F]) == 0x00FF
    assert run_ptx("shr.u32 $0, $1, 4;", [0x80000000]) == 0x08000000
