"""Raw Triton kernels for triton_impl.py (imported only on the GPU). Same math and layouts as
pallas_triton.py's kernels: h and y in slot layout, only real rows loaded and stored, the group
scale on the dequantised weights (SCALE_W) or on each plane's float32 product, float16 compute
when the activations are float16, and the min_bm bodies. No split-K, swap_ab or cols_first."""

import triton
import triton.language as tl

from pallas_kernels.moe.ptx import ASM, ASM_F16, ASM_FUSED, ASM_FUSED_F16, FUSED_M, fused_multiplier_exponent

_BF16, _F16 = tl.constexpr(ASM), tl.constexpr(ASM_F16)
_FUSED_BF16, _FUSED_F16 = tl.constexpr(ASM_FUSED), tl.constexpr(ASM_FUSED_F16)
# the fused forms' multipliers (even, odd planes) and offset per unit of scale, and the sums' factor
_MUL_BF16 = tl.constexpr(tuple(2.0 ** fused_multiplier_exponent(j, "bfloat16") for j in range(2)))
# float16: each multiplier as two factors that are float16 numbers (2^18 is none)
_MUL_F16 = tl.constexpr(tuple(2.0 ** (fused_multiplier_exponent(j, "float16") // 2) for j in range(2)))
_OFF_BF16, _OFF_F16 = tl.constexpr(-8.0 * 2.0 ** -FUSED_M["bfloat16"]), tl.constexpr(-8.0 * 2.0 ** -FUSED_M["float16"])
_UNDO_BF16, _UNDO_F16 = tl.constexpr(2.0 ** FUSED_M["bfloat16"]), tl.constexpr(2.0 ** FUSED_M["float16"])


@triton.jit
def _fused(s, J: tl.constexpr):
    """Plane J's scales s [BN] -> the fused forms' multiplier and offset [BN] in s's dtype
    (`dequant.fused_factors`), exact: powers of two within range. bf16 through float32: Triton
    3.6 makes a Python float operand of a bf16 tensor a bf16 constant that flushes 2^-29 to 0."""
    if s.dtype == tl.float16:
        mult, off = s * _MUL_F16[J % 2] * _MUL_F16[J % 2], s * _OFF_F16
    else:
        f = s.to(tl.float32)
        mult, off = f * _MUL_BF16[J % 2], f * _OFF_BF16
    return mult.to(s.dtype), off.to(s.dtype)


@triton.jit
def _plane(wq, w03, w47, s, J: tl.constexpr, ASM_ON: tl.constexpr, SCALE_W: tl.constexpr):
    """Plane J of a kernel-layout word tile wq [32, BN] as s's dtype (nibble - 8; times s [BN] when
    SCALE_W): through PTX for bf16 / float16 (ptx.py: one register pair = rows r, r + 1; with
    SCALE_W the fused forms, times 2^-M as well, undone in `_project`), else through integer ops on
    each row's planes 0-3 / 4-7 in w03 / w47 (`_row_words`)."""
    if ASM_ON:
        if SCALE_W:
            mult, off = _fused(s, J)
            sb = tl.broadcast_to(mult[None, :], wq.shape)
            cb = tl.broadcast_to(off[None, :], wq.shape)
            if s.dtype == tl.float16:
                p = tl.inline_asm_elementwise(_FUSED_F16[J], "=r,r,r,r,r", [wq, sb, cb], dtype=tl.float16,
                                              is_pure=True, pack=2)
            else:
                p = tl.inline_asm_elementwise(_FUSED_BF16[J], "=r,r,r,r,r", [wq, sb, cb], dtype=tl.bfloat16,
                                              is_pure=True, pack=2)
        else:
            if s.dtype == tl.float16:
                p = tl.inline_asm_elementwise(_F16[J], "=r,r,r", [wq], dtype=tl.float16, is_pure=True, pack=2)
            else:
                p = tl.inline_asm_elementwise(_BF16[J], "=r,r,r", [wq], dtype=tl.bfloat16, is_pure=True, pack=2)
    else:
        if J < 4:
            p = (((w03 >> (4 * J)) & 15) - 8).to(s.dtype)
        else:
            p = (((w47 >> (4 * (J - 4))) & 15) - 8).to(s.dtype)
        if SCALE_W:
            p = p * s[None, :]
    return p


@triton.jit
def _row_words(w, kb, cols, N, ASM_ON: tl.constexpr):
    """Word tile [32, BN] of K block kb at `cols` (w: this matrix's words [KW, N]) and, for the
    integer route (ASM_ON false), each row's planes 0-3 / 4-7 in the low 16 bits (`dequant.row_words`:
    from the row-pair partner, rows r ^ 1); with ASM_ON those two are the tile itself, unused."""
    r = tl.arange(0, 32)
    q = tl.load(w + (kb * 32 + r)[:, None] * N + cols[None, :])
    w03 = q
    w47 = q
    if not ASM_ON:
        odd = (r % 2)[:, None]
        p = tl.load(w + (kb * 32 + (r ^ 1))[:, None] * N + cols[None, :])
        w03 = tl.where(odd == 1, p, q) >> (16 * odd)
        w47 = tl.where(odd == 1, q, p) >> (16 * odd)
    return q, w03, w47


@triton.jit
def _dot(a, w):
    if a.dtype == tl.float32:
        d = tl.dot(a, w, out_dtype=tl.float32, input_precision="ieee")
    else:
        d = tl.dot(a, w, out_dtype=tl.float32)
    return d


@triton.jit
def _scale_planes(s_ptr, kb, cols, N, NP: tl.constexpr, dt: tl.constexpr):
    """The group scales of K block kb's planes 0..7 (rows kb*8 .. kb*8+7 of s_ptr's [K/32, N];
    planes >= NP read as 0) at `cols`: one [BN, 8] load split into 8 [BN] vectors of dtype dt, in
    place of 8 [BN] loads."""
    c8 = tl.arange(0, 8)
    t = tl.load(s_ptr + (kb * 8 + c8)[None, :] * N + cols[:, None], mask=(c8 < NP)[None, :], other=0).to(dt)
    bn: tl.constexpr = t.shape[0]
    even, odd = tl.split(tl.reshape(t, (bn, 4, 2)))            # planes 0 2 4 6 / 1 3 5 7
    e04, e26 = tl.split(tl.reshape(even, (bn, 2, 2)))
    o15, o37 = tl.split(tl.reshape(odd, (bn, 2, 2)))
    p0, p4 = tl.split(e04)
    p2, p6 = tl.split(e26)
    p1, p5 = tl.split(o15)
    p3, p7 = tl.split(o37)
    return p0, p1, p2, p3, p4, p5, p6, p7


@triton.jit
def _k_block(acc0, acc1, a_row, real, kb, w0, s0, w1, s1, cols, N, NP: tl.constexpr, TWO: tl.constexpr,
             INT4: tl.constexpr, ASM_ON: tl.constexpr, SCALE_W: tl.constexpr):
    """acc0 (and acc1 when TWO) += A[:, kb*256 : kb*256 + 32*NP] @ W0 (W1)[same rows, cols].
    a_row [BM] row pointers, real [BM] bool; w* / s* at this expert."""
    dt = a_row.dtype.element_ty
    r = tl.arange(0, 32)
    k0 = kb * 256
    if INT4:
        q0, lo0, hi0 = _row_words(w0, kb, cols, N, ASM_ON)
        ss0 = _scale_planes(s0, kb, cols, N, NP, dt)
        if TWO:
            q1, lo1, hi1 = _row_words(w1, kb, cols, N, ASM_ON)
            ss1 = _scale_planes(s1, kb, cols, N, NP, dt)
        for j in tl.static_range(NP):
            a = tl.load(a_row[:, None] + (k0 + 32 * j + r)[None, :], mask=real[:, None], other=0)
            sc0 = ss0[j]
            if SCALE_W:
                acc0 += _dot(a, _plane(q0, lo0, hi0, sc0, j, ASM_ON, True))
            else:
                acc0 += _dot(a, _plane(q0, lo0, hi0, sc0, j, ASM_ON, False)) * sc0.to(tl.float32)[None, :]
            if TWO:
                sc1 = ss1[j]
                if SCALE_W:
                    acc1 += _dot(a, _plane(q1, lo1, hi1, sc1, j, ASM_ON, True))
                else:
                    acc1 += _dot(a, _plane(q1, lo1, hi1, sc1, j, ASM_ON, False)) * sc1.to(tl.float32)[None, :]
    else:
        for j in tl.static_range(NP):
            a = tl.load(a_row[:, None] + (k0 + 32 * j + r)[None, :], mask=real[:, None], other=0)
            rows = (k0 + 32 * j + r)[:, None] * N + cols[None, :]
            acc0 += _dot(a, tl.load(w0 + rows).to(dt))
            if TWO:
                acc1 += _dot(a, tl.load(w1 + rows).to(dt))
    return acc0, acc1


@triton.jit
def _project(acc0, acc1, a_row, real, w0, s0, w1, s1, cols, N, K: tl.constexpr, TWO: tl.constexpr,
             INT4: tl.constexpr, ASM_ON: tl.constexpr, SCALE_W: tl.constexpr):
    for kb in range(0, K // 256):
        acc0, acc1 = _k_block(acc0, acc1, a_row, real, kb, w0, s0, w1, s1, cols, N, 8, TWO, INT4, ASM_ON,
                              SCALE_W)
    if K % 256:
        acc0, acc1 = _k_block(acc0, acc1, a_row, real, K // 256, w0, s0, w1, s1, cols, N, (K % 256) // 32,
                              TWO, INT4, ASM_ON, SCALE_W)
    if INT4 and ASM_ON and SCALE_W:   # the fused forms' 2^-M (`dequant.FUSED_UNDO`)
        if a_row.dtype.element_ty == tl.float16:
            acc0, acc1 = acc0 * _UNDO_F16, acc1 * _UNDO_F16
        else:
            acc0, acc1 = acc0 * _UNDO_BF16, acc1 * _UNDO_BF16
    return acc0, acc1


@triton.jit
def _block(row_slot_ptr, b, NUM_SLOTS: tl.constexpr, M: tl.constexpr, BM: tl.constexpr):
    """The first M rows of row block b (BM rows per block): slots [M] (NUM_SLOTS on padding rows),
    the same clamped to a real slot, and real [M] bool."""
    slots = tl.load(row_slot_ptr + b * BM + tl.arange(0, M))
    return slots, tl.minimum(slots, NUM_SLOTS - 1), slots < NUM_SLOTS


@triton.jit
def _body_rows(row_slot_ptr, b, NUM_SLOTS: tl.constexpr, BM: tl.constexpr, MIN_BM: tl.constexpr):
    """Rows block b's body multiplies: the smallest of BM, BM / 2, ..., MIN_BM holding its real
    rows, a prefix of the block (`pallas_triton.block_rows`)."""
    m = tl.full((), BM, tl.int32)
    for i in tl.static_range(1, 8):
        if (BM >> i) >= MIN_BM:
            m = tl.where(tl.load(row_slot_ptr + b * BM + (BM >> i)) >= NUM_SLOTS, BM >> i, m)
    return m


@triton.jit
def _gate_up_body(row_slot_ptr, b, e, x_ptr, row_scale_ptr, wg_ptr, sg_ptr, wu_ptr, su_ptr, h_ptr,
                  D: tl.constexpr, N: tl.constexpr, KW: tl.constexpr, TOP_K: tl.constexpr,
                  NUM_SLOTS: tl.constexpr, M: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                  INT4: tl.constexpr, ASM: tl.constexpr, SCALE_W: tl.constexpr, SCALED: tl.constexpr):
    slots, clamped, real = _block(row_slot_ptr, b, NUM_SLOTS, M, BM)
    tok = (clamped // TOP_K).to(tl.int64)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    w_off = e * KW * N
    s_off = e * (KW // 4) * N
    zero = tl.zeros((M, BN), tl.float32)
    g, u = _project(zero, zero, x_ptr + tok * D, real, wg_ptr + w_off, sg_ptr + s_off, wu_ptr + w_off,
                    su_ptr + s_off, cols, N, D, True, INT4, ASM, SCALE_W)
    if SCALED:
        c = tl.load(row_scale_ptr + tok)[:, None]
        g, u = g * c, u * c
    h = g / (1.0 + tl.exp(-g)) * u
    tl.store(h_ptr + slots.to(tl.int64)[:, None] * N + cols[None, :], h.to(h_ptr.dtype.element_ty),
             mask=real[:, None])


@triton.jit
def gate_up(row_slot_ptr, block_expert_ptr, x_ptr, row_scale_ptr, wg_ptr, sg_ptr, wu_ptr, su_ptr, into_ptr, h_ptr,
            D: tl.constexpr, N: tl.constexpr, KW: tl.constexpr, TOP_K: tl.constexpr, NUM_SLOTS: tl.constexpr,
            BM: tl.constexpr, MIN_BM: tl.constexpr, BN: tl.constexpr, INT4: tl.constexpr, ASM: tl.constexpr,
            SCALE_W: tl.constexpr, SCALED: tl.constexpr):
    """h[slot, cols] = SiLU(x[tok] @ Wg[e]) * (x[tok] @ Wu[e]) for the real slots of row block
    program_id(0), tok = slot // TOP_K; SCALED: times row_scale[tok] before the epilogue. MIN_BM > 0:
    the block multiplies only the smallest power-of-two prefix (>= MIN_BM rows) holding its real
    rows. into_ptr: the buffer h aliases (triton_impl's `out`) or any array; never read."""
    b = tl.program_id(0)
    e = tl.load(block_expert_ptr + b).to(tl.int64)
    if e >= 0:
        if MIN_BM == 0:
            _gate_up_body(row_slot_ptr, b, e, x_ptr, row_scale_ptr, wg_ptr, sg_ptr, wu_ptr, su_ptr, h_ptr, D, N, KW,
                          TOP_K, NUM_SLOTS, BM, BM, BN, INT4, ASM, SCALE_W, SCALED)
        else:
            m = _body_rows(row_slot_ptr, b, NUM_SLOTS, BM, MIN_BM)
            for i in tl.static_range(0, 8):
                if (BM >> i) >= MIN_BM:
                    if m == (BM >> i):
                        _gate_up_body(row_slot_ptr, b, e, x_ptr, row_scale_ptr, wg_ptr, sg_ptr, wu_ptr, su_ptr, h_ptr,
                                      D, N, KW, TOP_K, NUM_SLOTS, BM >> i, BM, BN, INT4, ASM, SCALE_W, SCALED)


@triton.jit
def _down_body(row_slot_ptr, slot_weight_ptr, b, e, h_ptr, wd_ptr, sd_ptr, y_ptr, I: tl.constexpr,
               N: tl.constexpr, KW: tl.constexpr, NUM_SLOTS: tl.constexpr, M: tl.constexpr, BM: tl.constexpr,
               BN: tl.constexpr, INT4: tl.constexpr, ASM: tl.constexpr, SCALE_W: tl.constexpr):
    slots, clamped, real = _block(row_slot_ptr, b, NUM_SLOTS, M, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    zero = tl.zeros((M, BN), tl.float32)
    y, _ = _project(zero, zero, h_ptr + clamped.to(tl.int64) * I, real, wd_ptr + e * KW * N,
                    sd_ptr + e * (KW // 4) * N, wd_ptr, sd_ptr, cols, N, I, False, INT4, ASM, SCALE_W)
    y = y * tl.load(slot_weight_ptr + clamped)[:, None]
    tl.store(y_ptr + slots.to(tl.int64)[:, None] * N + cols[None, :], y, mask=real[:, None])


@triton.jit
def down(row_slot_ptr, slot_weight_ptr, block_expert_ptr, h_ptr, wd_ptr, sd_ptr, into_ptr, y_ptr, I: tl.constexpr,
         N: tl.constexpr, KW: tl.constexpr, NUM_SLOTS: tl.constexpr, BM: tl.constexpr, MIN_BM: tl.constexpr,
         BN: tl.constexpr, INT4: tl.constexpr, ASM: tl.constexpr, SCALE_W: tl.constexpr):
    """y[slot, cols] = slot_weight[slot] * (h[slot] @ Wd[e]) for the real slots of row block
    program_id(0); MIN_BM and into_ptr as gate_up's."""
    b = tl.program_id(0)
    e = tl.load(block_expert_ptr + b).to(tl.int64)
    if e >= 0:
        if MIN_BM == 0:
            _down_body(row_slot_ptr, slot_weight_ptr, b, e, h_ptr, wd_ptr, sd_ptr, y_ptr, I, N, KW, NUM_SLOTS, BM, BM,
                       BN, INT4, ASM, SCALE_W)
        else:
            m = _body_rows(row_slot_ptr, b, NUM_SLOTS, BM, MIN_BM)
            for i in tl.static_range(0, 8):
                if (BM >> i) >= MIN_BM:
                    if m == (BM >> i):
                        _down_body(row_slot_ptr, slot_weight_ptr, b, e, h_ptr, wd_ptr, sd_ptr, y_ptr, I, N, KW,
                                   NUM_SLOTS, BM >> i, BM, BN, INT4, ASM, SCALE_W)
