"""The "pallas_triton" implementation of moe_experts: two grouped GEMM kernels over aligned slots.

Grid (row block b, column tile n[, K split]); block b's rows all belong to expert `block_expert[b]`
(-1: the program does nothing). INT4 weights are read as kernel-layout words [32, BN] per 256-wide K block
and dequantised in registers into 8 planes, one K=32 dot each; each group's scale multiplies the
dequantised weights (`scale_weights`, every tuned config) or the [BM, BN] f32 dot output. With
`min_bm` a block multiplies only the smallest power-of-two prefix of rows holding its real rows.
1. gate_up: h[row] = SiLU(x[token] @ Wg) * (x[token] @ Wu), x gathered by token in the kernel.
2. down: y[row] = w_row * (h[row] @ Wd), float32.
INT4 experts with float16 scales (`int4.to_kernel_layout(scale_dtype=float16)`) multiply in float16:
its 10-bit mantissa holds a nibble at bit 4 in place (`ptx.asm_source_f16`: half the planes shift) and
rounds the dequantised weights 8x finer than bf16. bf16 activations are then scaled per row by a
power of two into float16's range (`to_f16_rows`, exact), gate_up writes float32 h, and the scales
are undone in gate_up's epilogue and in down's row weights.
Only real rows (row_slot < T*k) are loaded and written, and h and y are in slot layout ([T*k, .],
slot = token * k + j), so padding rows exist only as masked lanes of a block: at decode sizes most
rows of a block are padding (T = 64, top-8: 512 real rows of 6,272), whose reads and writes would
otherwise add to the weight stream, and the XLA passes of the float16 path read T*k rows, not R.
The top-k results are then summed per token: deterministic, no atomics. Dropped slots (`valid`)
have no row, so no program reads or writes them; their never-written h and y rows are left out of
the per-token sum.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels import registry
from pallas_kernels.moe import int4, tuning
from pallas_kernels.moe.align import align_routing
from pallas_kernels.moe.dequant import FUSED_UNDO, plane, row_words
from pallas_kernels.moe.experts import Dims, check_moe_inputs, dims as expert_dims
from pallas_kernels.pallas_compat import interpret_mode, pl, plgpu


def col_block(n: int, bn: int) -> int:
    """Largest power of two <= bn dividing n (n is a multiple of 32 for every expert matrix)."""
    while n % bn:
        bn //= 2
    return bn


def _k_chunk(k: int) -> int:
    """bf16 weights: K chunk, the lowest power of two of k capped at 64 (needs k % 16 == 0)."""
    chunk = min(64, k & -k)
    if chunk < 16:
        raise ValueError(f"bf16 experts: input dim {k} must be a multiple of 16 for the Pallas kernels")
    return chunk


def _dot(a, w, swap_ab=False):
    """a [M, K] @ w [K, N] with float32 accumulation; float32 operands in full precision.

    swap_ab: returns the transpose [N, M] = w^T a^T (the weight tile is the MMA's M side).
    """
    prec = jax.lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
    dims = (((0,), (1,)), ((), ())) if swap_ab else (((1,), (0,)), ((), ()))
    lhs, rhs = (w, a) if swap_ab else (a, w)
    return jax.lax.dot_general(lhs, rhs, dims, precision=prec, preferred_element_type=jnp.float32)


def _project(load_a, ws, e, n0, bm, bn, k, *, int4_weights, dtype, route, cfg, split=None):
    """sum_k A[:, k] W[k, n0:n0+bn] for each W in `ws`: [(qweight, qscale) refs] or [weight refs].

    load_a(k0, size) -> [BM, size] activations. Returns one float32 [BM, BN] per W.
    split: (index, count) of a split-K program: it sums only its share of the K steps (256-wide
    blocks, or bf16 chunks); the K tail goes to the last split.
    cfg.scale_weights: the group scale multiplies the dequantised weights (in `dtype`) and all
    planes accumulate into one accumulator, instead of rescaling each plane's float32 dot output
    (route "asm": the fused forms, whose 2^-M the sums lose here, `dequant.plane_asm`).
    cfg.swap_ab: accumulate the [BN, BM] transpose (weights on the MMA's M side).
    """
    cols = pl.ds(n0, bn)
    swap = cfg.swap_ab
    zero = tuple(jnp.zeros((bn, bm) if swap else (bm, bn), jnp.float32) for _ in ws)
    chunk = int4.KBLOCK if int4_weights else _k_chunk(k)
    full, tail = divmod(k, chunk)
    if int4_weights:
        def kblock(kb, accs, n_planes):
            accs = list(accs)
            words = [qw[e, pl.ds(kb * int4.PLANE, int4.PLANE), cols] for qw, _ in ws]
            halves = [None] * len(ws)
            if route == "bits":     # with each word's row-pair partner (rows r ^ 1)
                rows = (kb * int4.PLANE + (jnp.arange(int4.PLANE) ^ 1))[:, None]
                halves = [row_words(w, plgpu.load(qw.at[e, rows, (n0 + jnp.arange(bn))[None, :]]))
                          for w, (qw, _) in zip(words, ws)]
            # a full block's 8 scale rows as one [8, BN] load, split into the planes' rows
            scales = [[r[0] for r in jnp.split(qs[e, pl.ds(kb * 8, 8), cols], 8, axis=0)]
                      if n_planes == 8 else None for _, qs in ws]
            for j in range(n_planes):
                a = load_a(kb * int4.KBLOCK + j * int4.PLANE, int4.PLANE)   # shared by gate and up
                for i, (_, qs) in enumerate(ws):
                    s = scales[i][j] if scales[i] else qs[e, kb * 8 + j, cols]
                    if cfg.scale_weights:
                        accs[i] = accs[i] + _dot(a, plane(words[i], j, dtype, route, s, halves[i]), swap)
                    else:
                        s = s.astype(jnp.float32)
                        d = _dot(a, plane(words[i], j, dtype, route, words=halves[i]), swap)
                        accs[i] = accs[i] + d * (s[:, None] if swap else s[None, :])
            return tuple(accs)

        step = lambda kb, accs: kblock(kb, accs, 8)
        last = lambda accs: kblock(full, accs, tail // int4.PLANE)
    else:
        def step(i, accs):
            a = load_a(i * chunk, chunk)
            return tuple(acc + _dot(a, w[e, pl.ds(i * chunk, chunk), cols].astype(dtype), swap)
                         for acc, w in zip(accs, ws))

        last = None   # _k_chunk divides k
    if split is None:
        accs = jax.lax.fori_loop(0, full, step, zero)
        if tail:
            accs = last(accs)
    else:
        index, count = split
        per = -(-full // count)
        lo = jnp.minimum(index * per, full)
        accs = jax.lax.fori_loop(lo, jnp.minimum(lo + per, full), step, zero)
        if tail:
            accs = tuple(jnp.where(index == count - 1, t, a) for t, a in zip(last(accs), accs))
    if int4_weights and cfg.scale_weights and route == "asm":
        accs = tuple(acc * FUSED_UNDO[jnp.dtype(dtype)] for acc in accs)
    return tuple(acc.T for acc in accs) if swap else accs


def _block_and_tile(cfg):
    """(row block b, column tile n) of this program: grid (b, n), or (n, b) with cfg.cols_first."""
    first, second = pl.program_id(0), pl.program_id(1)
    return (second, first) if cfg.cols_first else (first, second)


def _grid(blocks: int, tiles: int, cfg) -> tuple[int, int]:
    return (tiles, blocks) if cfg.cols_first else (blocks, tiles)


def block_rows(row_slot, b, bm: int, min_bm: int, num_slots: int):
    """Rows row block b's body multiplies (int32 scalar): the smallest of bm, bm / 2, ..., min_bm
    (min_bm 0: bm) holding the block's real rows, which are a prefix of it (padding rows end an
    expert's run). row_slot [R]: a ref or array, num_slots on padding rows."""
    m, size = jnp.int32(bm), bm // 2
    while min_bm and size >= min_bm:       # row `size` is padding: the real rows fit in `size`
        m = jnp.where(row_slot[b * bm + size] >= num_slots, jnp.int32(size), m)
        size //= 2
    return m


def _block_slots(row_slot_ref, b, bm, m, num_slots):
    """The first m rows of row block b (bm rows per block): (slots [m], num_slots on padding rows;
    the same clamped to a real slot, for loads; real [m, 1] bool). Masked stores take the
    unclamped slots: a padding row must not share its masked lane's address with a real row
    (interpret mode writes masked lanes back)."""
    slots = row_slot_ref[pl.ds(b * bm, m)]
    return slots, jnp.minimum(slots, num_slots - 1), (slots < num_slots)[:, None]


def _row_bodies(row_slot_ref, b, e, bm, cfg, body, num_slots):
    """body(m) for row block b of expert e (e < 0: nothing), m = block_rows(...): one body per
    candidate m in the kernel, so the dequantised weights serve an expert's few real rows once
    without multiplying the block's padding rows (cfg.min_bm)."""
    sizes = [bm]
    while cfg.min_bm and sizes[-1] > cfg.min_bm:
        sizes.append(sizes[-1] // 2)
    if len(sizes) == 1:
        pl.when(e >= 0)(functools.partial(body, bm))
        return
    m = block_rows(row_slot_ref, b, bm, cfg.min_bm, num_slots)
    for size in sizes:
        pl.when((e >= 0) & (m == size))(functools.partial(body, size))


def _gate_up_kernel(row_slot_ref, block_expert_ref, x_ref, *refs, bm, bn, k, top_k, int4_weights, route,
                    cfg, aliased, scaled):
    if scaled:                                               # row_scale [T]: x rows were divided by it
        row_scale_ref, refs = refs[0], refs[1:]
    n_out = 2 if cfg.split_k > 1 else 1                      # split: gate and up partial sums
    w_refs = refs[:len(refs) - n_out * (2 if aliased else 1)]  # an aliased input is never read
    out_refs = refs[len(refs) - n_out:]
    b, n = _block_and_tile(cfg)
    split = (pl.program_id(2), cfg.split_k) if cfg.split_k > 1 else None   # read outside pl.when
    e = block_expert_ref[b]

    num_slots = x_ref.shape[0] * top_k

    def body(m):
        slots, clamped, real = _block_slots(row_slot_ref, b, bm, m, num_slots)
        tokens = clamped // top_k
        ws = [tuple(w_refs[i:i + 2]) for i in (0, 2)] if int4_weights else list(w_refs)
        g, u = _project(
            lambda k0, size: plgpu.load(
                x_ref.at[tokens[:, None], (k0 + jnp.arange(size))[None, :]], mask=real, other=0),
            ws, e, n * bn, m, bn, k, int4_weights=int4_weights, dtype=x_ref.dtype, route=route,
            cfg=cfg, split=split)
        rows, cols = slots[:, None], (n * bn + jnp.arange(bn))[None, :]
        if scaled:
            c = plgpu.load(row_scale_ref.at[tokens])[:, None]
            g, u = g * c, u * c
        mask = jnp.broadcast_to(real, g.shape)
        if split is None:
            plgpu.store(out_refs[0].at[rows, cols], _silu_mul(g, u).astype(out_refs[0].dtype),
                        mask=mask)
        else:
            plgpu.store(out_refs[0].at[split[0], rows, cols], g, mask=mask)
            plgpu.store(out_refs[1].at[split[0], rows, cols], u, mask=mask)

    _row_bodies(row_slot_ref, b, e, bm, cfg, body, num_slots)


def _silu_mul(g, u):
    return g / (1.0 + jnp.exp(-g)) * u


def _down_kernel(row_slot_ref, slot_weight_ref, block_expert_ref, h_ref, *refs, bm, bn, k,
                 int4_weights, route, cfg, aliased):
    w_refs, y_ref = refs[:-2 if aliased else -1], refs[-1]
    b, n = _block_and_tile(cfg)
    split = (pl.program_id(2), cfg.split_k) if cfg.split_k > 1 else None   # read outside pl.when
    e = block_expert_ref[b]

    num_slots = h_ref.shape[0]

    def body(m):
        slots, clamped, real = _block_slots(row_slot_ref, b, bm, m, num_slots)
        ws = [tuple(w_refs)] if int4_weights else list(w_refs)
        (y,) = _project(
            lambda k0, size: plgpu.load(h_ref.at[clamped[:, None], (k0 + jnp.arange(size))[None, :]],
                                        mask=real, other=0),
            ws, e, n * bn, m, bn, k, int4_weights=int4_weights, dtype=h_ref.dtype, route=route,
            cfg=cfg, split=split)
        w = plgpu.load(slot_weight_ref.at[clamped])
        idx = (slots[:, None], (n * bn + jnp.arange(bn))[None, :])
        plgpu.store(y_ref.at[idx if split is None else (split[0], *idx)], y * w[:, None],
                    mask=jnp.broadcast_to(real, y.shape))

    _row_bodies(row_slot_ref, b, e, bm, cfg, body, num_slots)


def _call(kernel, grid, out_shape, args, cfg, out, warps=0, stages=0):
    """pallas_call; writes into `out` (buffers of out_shape, e.g. NaN-poisoned) when given.
    warps, stages: 0 takes cfg.num_warps, cfg.num_stages."""
    outs = () if out is None else tuple(out) if isinstance(out, (tuple, list)) else (out,)
    return pl.pallas_call(
        functools.partial(kernel, aliased=bool(outs)), out_shape=out_shape,
        grid=grid + ((cfg.split_k,) if cfg.split_k > 1 else ()),
        input_output_aliases={len(args) + i: i for i in range(len(outs))},
        compiler_params=plgpu.CompilerParams(num_warps=warps or cfg.num_warps,
                                             num_stages=stages or cfg.num_stages),
        interpret=interpret_mode(),
    )(*args, *outs)


def _weights(experts, name, int4_weights):
    if int4_weights:
        return [experts[f"{name}_qweight"], experts[f"{name}_qscale"]]
    return [experts[f"{name}_kernel"]]


def _route(cfg, dtype) -> str:
    asm = cfg.dequant == "asm" and dtype in (jnp.bfloat16, jnp.float16) and not interpret_mode()
    return "asm" if asm else "bits"


def f16_compute(x_dtype, experts, cfg) -> bool:
    """Whether the kernels multiply in float16: INT4 experts with float16 scales, bf16 / f16
    activations (float32 ones stay float32) and cfg.f16."""
    f16 = "gate_qscale" in experts and experts["gate_qscale"].dtype == jnp.float16
    return f16 and cfg.f16 and x_dtype in (jnp.bfloat16, jnp.float16)


def to_f16_rows(a):
    """a [R, K] float -> (a / c as float16 [R, K], c [R] float32): c a power of two per row putting
    the row's largest magnitude in [2^14, 2^15) (1 for all-zero rows). Exact for bf16 inputs (8-bit
    significands; entries below 2^-28 of the row's largest lose bits as float16 subnormals);
    float32 rounds to 11 bits."""
    a = a.astype(jnp.float32)
    amax = jnp.max(jnp.abs(a), axis=1)
    _, ex = jnp.frexp(jnp.where(amax > 0, amax, 1.0))          # amax in [2^(ex-1), 2^ex)
    c = jnp.where(amax > 0, jnp.ldexp(jnp.float32(1), ex - 15), 1.0)
    return (a / c[:, None]).astype(jnp.float16), c


def gate_up(x, row_slot, block_expert, experts, dm: Dims, cfg, top_k: int, out=None, row_scale=None):
    """h [T*k, I] x.dtype in slot layout: h[s] = SiLU(x[s // k] @ Wg[e]) * (x[s // k] @ Wu[e]) for
    every slot s, e the expert of s's row block. row_slot [R] int32: each aligned row's slot (T*k on
    padding rows: `align.Routing`). row_scale [T] float32: x's rows were divided by it
    (`to_f16_rows`); the kernel multiplies g and u back, and h is float32.

    cfg.split_k > 1: the kernel writes float32 gate and up partial sums [split_k, T*k, I] (`out`: a
    pair of such buffers) and XLA reduces them and applies the epilogue.
    """
    bn = col_block(dm.intermediate, cfg.check().bn_up)
    scaled = row_scale is not None
    kernel = functools.partial(_gate_up_kernel, bm=cfg.bm, bn=bn, k=dm.hidden, top_k=top_k,
                               int4_weights=dm.int4, route=_route(cfg, x.dtype), cfg=cfg, scaled=scaled)
    args = [row_slot, block_expert, x, *([row_scale] if scaled else []),
            *_weights(experts, "gate", dm.int4), *_weights(experts, "up", dm.int4)]
    h_dtype = jnp.float32 if scaled else x.dtype
    grid = _grid(block_expert.shape[0], dm.intermediate // bn, cfg)
    slots = x.shape[0] * top_k
    if cfg.split_k == 1:
        shape = jax.ShapeDtypeStruct((slots, dm.intermediate), h_dtype)
        return _call(kernel, grid, shape, args, cfg, out)
    part = jax.ShapeDtypeStruct((cfg.split_k, slots, dm.intermediate), jnp.float32)
    g, u = _call(kernel, grid, (part, part), args, cfg, out)      # row_scale applied in the kernel
    return _silu_mul(g.sum(0), u.sum(0)).astype(h_dtype)


def down(h, row_slot, slot_weight, block_expert, experts, dm: Dims, cfg, out=None):
    """y [T*k, d] float32 in slot layout: y[s] = slot_weight[s] * (h[s] @ Wd[e]) for every slot s
    (h [T*k, I] in slot layout, row_slot [R] as `gate_up`'s, slot_weight [T*k] float32).

    cfg.split_k > 1: the kernel writes partial sums [split_k, T*k, d] (`out`: such a buffer), summed here.
    """
    bn = col_block(dm.hidden, cfg.check().bn_down)
    kernel = functools.partial(_down_kernel, bm=cfg.bm, bn=bn, k=dm.intermediate,
                               int4_weights=dm.int4, route=_route(cfg, h.dtype), cfg=cfg)
    args = [row_slot, slot_weight, block_expert, h, *_weights(experts, "down", dm.int4)]
    split = (cfg.split_k,) if cfg.split_k > 1 else ()
    shape = jax.ShapeDtypeStruct((*split, h.shape[0], dm.hidden), jnp.float32)
    y = _call(kernel, _grid(block_expert.shape[0], dm.hidden // bn, cfg), shape, args, cfg, out,
              cfg.down_warps, cfg.down_stages)
    return y.sum(0) if split else y


def slot_experts(x, topk_ids, topk_weights, experts, dm: Dims, cfg, gate_up_fn=None, down_fn=None,
                 valid=None):
    """x [T, d] through the routed experts with a gate_up / down kernel pair of these signatures
    (default: this module's; triton_impl passes its own): routing alignment of the valid slots
    (valid [T, k] bool; None: all), the float16 row scaling when `f16_compute`, and the sum of each
    token's valid slots. -> [T, d] x.dtype."""
    gate_up_fn, down_fn = gate_up_fn or gate_up, down_fn or down
    t, k = topk_ids.shape
    r = align_routing(topk_ids, dm.num_experts, cfg.bm, valid)
    w = topk_weights.reshape(-1).astype(jnp.float32)
    if f16_compute(x.dtype, experts, cfg):   # rows into float16's range, undone in the epilogues
        x16, cx = to_f16_rows(x)
        h = gate_up_fn(x16, r.row_slot, r.block_expert, experts, dm, cfg, k, row_scale=cx)
        h16, ch = to_f16_rows(h)
        y = down_fn(h16, r.row_slot, w * ch, r.block_expert, experts, dm, cfg)
    else:
        h = gate_up_fn(x, r.row_slot, r.block_expert, experts, dm, cfg, k)
        y = down_fn(h, r.row_slot, w, r.block_expert, experts, dm, cfg)
    y = y.reshape(t, k, -1)
    if valid is not None:     # a dropped slot's row of y was never written
        y = jnp.where(valid[:, :, None], y, 0.0)
    return y.sum(axis=1).astype(x.dtype)


@functools.partial(jax.jit, static_argnames=("cfg",))
def moe_experts_pallas(x, topk_ids, topk_weights, experts, valid=None, *,
                       cfg: tuning.MoEConfig | None = None):
    """x [T, d], topk_ids [T, k], topk_weights [T, k], experts, valid [T, k] bool or None -> [T, d]
    x.dtype (cfg: tuning.config(T))."""
    dm = check_moe_inputs(x, topk_ids, topk_weights, experts, valid)
    return slot_experts(x, topk_ids, topk_weights, experts, dm, cfg or tuning.config(x.shape[0]),
                        valid=valid)


def supports(x, topk_ids, topk_weights, experts, valid=None) -> str | None:
    """Why the registered "pallas_triton" implementation cannot take these experts, or None."""
    dm = expert_dims(experts)
    if not dm.int4 and (dm.hidden % 16 or dm.intermediate % 16):
        return f"bf16 experts: d ({dm.hidden}) and I ({dm.intermediate}) must be multiples of 16"
    return None


registry.register("moe_experts", "pallas_triton", supports=supports)(
    lambda x, topk_ids, topk_weights, experts, valid=None: moe_experts_pallas(
        x, topk_ids, topk_weights, experts, valid))
