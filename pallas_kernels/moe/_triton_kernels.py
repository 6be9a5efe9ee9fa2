"""Raw Triton kernels for triton_impl.py (imported only on the GPU). Same math as pallas_triton.py."""

import triton
import triton.language as tl

from pallas_kernels.moe.dequant import ASM

_A0, _A1, _A2, _A3, _A4, _A5, _A6, _A7 = (tl.constexpr(a) for a in ASM)


@triton.jit
def _asm(wq, src: tl.constexpr):
    return tl.inline_asm_elementwise(src, "=r,r,r", [wq], dtype=tl.bfloat16, is_pure=True, pack=2)


@triton.jit
def _plane(wq, J: tl.constexpr, ASM_ON: tl.constexpr):
    """Plane J of a kernel-layout word tile: bf16 through PTX, or float32 through bit ops."""
    if ASM_ON:
        if J == 0:
            p = _asm(wq, _A0)
        elif J == 1:
            p = _asm(wq, _A1)
        elif J == 2:
            p = _asm(wq, _A2)
        elif J == 3:
            p = _asm(wq, _A3)
        elif J == 4:
            p = _asm(wq, _A4)
        elif J == 5:
            p = _asm(wq, _A5)
        elif J == 6:
            p = _asm(wq, _A6)
        else:
            p = _asm(wq, _A7)
    else:
        p = (((wq >> (4 * J)) & 15) - 8).to(tl.float32)
    return p


@triton.jit
def _dot(a, w):
    if a.dtype == tl.float32:
        d = tl.dot(a, w.to(tl.float32), out_dtype=tl.float32, input_precision="ieee")
    else:
        d = tl.dot(a, w.to(a.dtype), out_dtype=tl.float32)
    return d


@triton.jit
def _k_block(acc, a_row_ptr, kb, w_ptr, s_ptr, cols, N, NP: tl.constexpr, INT4: tl.constexpr,
             ASM_ON: tl.constexpr):
    """acc += A[:, kb*256 : kb*256 + 32*NP] @ W[same rows, cols]; w_ptr / s_ptr at this expert."""
    r = tl.arange(0, 32)
    k0 = kb * 256
    if INT4:
        wq = tl.load(w_ptr + (kb * 32 + r)[:, None] * N + cols[None, :])
        for j in tl.static_range(NP):
            a = tl.load(a_row_ptr[:, None] + (k0 + 32 * j + r)[None, :])
            s = tl.load(s_ptr + (kb * 8 + j) * N + cols).to(tl.float32)
            acc += _dot(a, _plane(wq, j, ASM_ON)) * s[None, :]
    else:
        for j in tl.static_range(NP):
            a = tl.load(a_row_ptr[:, None] + (k0 + 32 * j + r)[None, :])
            acc += _dot(a, tl.load(w_ptr + (k0 + 32 * j + r)[:, None] * N + cols[None, :]))
    return acc


@triton.jit
def _project(acc, a_row_ptr, w_ptr, s_ptr, cols, N, K: tl.constexpr, INT4: tl.constexpr,
             ASM_ON: tl.constexpr):
    for kb in range(0, K // 256):
        acc = _k_block(acc, a_row_ptr, kb, w_ptr, s_ptr, cols, N, 8, INT4, ASM_ON)
    if K % 256:
        acc = _k_block(acc, a_row_ptr, K // 256, w_ptr, s_ptr, cols, N, (K % 256) // 32, INT4, ASM_ON)
    return acc


@triton.jit
def gate_up(row_token_ptr, block_expert_ptr, x_ptr, wg_ptr, sg_ptr, wu_ptr, su_ptr, h_ptr,
            D: tl.constexpr, N: tl.constexpr, KW: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
            INT4: tl.constexpr, ASM: tl.constexpr):
    """h[rows, cols] = SiLU(x[tok] @ Wg[e]) * (x[tok] @ Wu[e]) for row block program_id(0)."""
    b = tl.program_id(0)
    e = tl.load(block_expert_ptr + b).to(tl.int64)
    if e >= 0:
        rows = b * BM + tl.arange(0, BM)
        cols = tl.program_id(1) * BN + tl.arange(0, BN)
        tok = tl.load(row_token_ptr + rows).to(tl.int64)
        a_row = x_ptr + tok * D
        w_off = e * KW * N
        s_off = e * (KW // 4) * N
        g = _project(tl.zeros((BM, BN), tl.float32), a_row, wg_ptr + w_off, sg_ptr + s_off, cols, N,
                     D, INT4, ASM)
        u = _project(tl.zeros((BM, BN), tl.float32), a_row, wu_ptr + w_off, su_ptr + s_off, cols, N,
                     D, INT4, ASM)
        h = g / (1.0 + tl.exp(-g)) * u
        tl.store(h_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :], h.to(h_ptr.dtype.element_ty))


@triton.jit
def down(row_weight_ptr, block_expert_ptr, h_ptr, wd_ptr, sd_ptr, y_ptr, I: tl.constexpr,
         N: tl.constexpr, KW: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, INT4: tl.constexpr,
         ASM: tl.constexpr):
    """y[rows, cols] = row_weight[rows] * (h[rows] @ Wd[e]) for row block program_id(0)."""
    b = tl.program_id(0)
    e = tl.load(block_expert_ptr + b).to(tl.int64)
    if e >= 0:
        rows = b * BM + tl.arange(0, BM)
        cols = tl.program_id(1) * BN + tl.arange(0, BN)
        a_row = h_ptr + rows.to(tl.int64) * I
        y = _project(tl.zeros((BM, BN), tl.float32), a_row, wd_ptr + e * KW * N,
                     sd_ptr + e * (KW // 4) * N, cols, N, I, INT4, ASM)
        y = y * tl.load(row_weight_ptr + rows)[:, None]
        tl.store(y_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :], y)
