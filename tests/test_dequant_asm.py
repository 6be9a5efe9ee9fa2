"""The INT4 dequantisation PTX (pallas_kernels.moe.ptx, GPU-only "asm" route) run on the CPU by
a small interpreter of the instructions it uses, against the nibble arithmetic it replaces.

Operand convention of `elementwise_inline_asm(..., pack=2)`: $0 is the output register (two bf16
or float16, the first element in the low half), $1 and $2 the kernel-layout words of one row pair
(rows r, r + 1 of a K block's word tile), $3 the x2 scales (scaled variants). The expected values
come from the row pair's plane words L0, L1 (nibble j = plane j, the arithmetic the kernels
replaced), stored as `int4.py` documents: $1 = L0[0:16] | L1[0:16] << 16, $2 = L0[16:32] | L1[16:32] << 16.
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

from pallas_kernels.moe.ptx import ASM, ASM_F16, ASM_F16_SCALED, ASM_SCALED
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


@pytest.mark.parametrize("j", range(8))
def test_plane_asm_matches_nibbles(j):
    rng = fresh_rng()
    words = rng.integers(-2**31, 2**31, size=(64, 2), dtype=np.int64)
    words[0] = (0x88888888 - 2**32, 0x77777777)      # n = 8 (zero) and n = 7 in every plane
    scales = rng.standard_normal((64, 2)).astype(BF16)
    for (l0, l1), s in zip(words, scales):
        nib = _nibbles(int(l0), int(l1), j)
        got = _halves(run_ptx(ASM[j], _stored(int(l0), int(l1))))
        np.testing.assert_array_equal(got, nib)
        got_s = _halves(run_ptx(ASM_SCALED[j], [*_stored(int(l0), int(l1)), _pack(s.astype(np.float64))]))
        want = (nib * s.astype(np.float64)).astype(BF16).astype(np.float64)
        np.testing.assert_array_equal(got_s, want)


@pytest.mark.parametrize("j", range(8))
def test_plane_asm_f16_matches_nibbles(j):
    """float16: n - 8 exactly (nibble at bit 4: (1024 + 16 n) / 16 - 72), times s rounded once."""
    rng = fresh_rng()
    words = rng.integers(-2**31, 2**31, size=(64, 2), dtype=np.int64)
    words[0] = (0x88888888 - 2**32, 0x77777777)
    scales = (rng.standard_normal((64, 2)) * 0.01).astype(np.float16)
    for (l0, l1), s in zip(words, scales):
        nib = _nibbles(int(l0), int(l1), j)
        stored = _stored(int(l0), int(l1))
        np.testing.assert_array_equal(_halves(run_ptx(ASM_F16[j], stored), np.float16), nib)
        got_s = _halves(run_ptx(ASM_F16_SCALED[j], [*stored, _pack(s.astype(np.float64), np.float16)]),
                        np.float16)
        want = (nib * s.astype(np.float64)).astype(np.float16).astype(np.float64)
        np.testing.assert_array_equal(got_s, want)


def test_no_byte_gathering():
    """Each plane reads one of the two words and needs at most one shift before its mask."""
    for src in ASM + ASM_SCALED + ASM_F16 + ASM_F16_SCALED:
        assert "prmt" not in src and src.count("shr.u32") <= 1 and ("$1" in src) != ("$2" in src)


def test_interpreter_primitives():
    """lop3 and shr as the PTX manual defines them, on hand-checked values."""
    assert run_ptx("lop3.b32 $0, $1, $2, $3, 0xEA;", [0xF0F0, 0x0FF0, 0x000F]) == 0x00FF
    assert run_ptx("shr.u32 $0, $1, 4;", [0x80000000]) == 0x08000000
