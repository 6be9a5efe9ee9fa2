"""The "pallas_triton" implementation of moe_experts: two grouped GEMM kernels over aligned slots.

Grid (row block b, column tile n[, K split]); block b's rows all belong to expert `block_expert[b]`
(-1: the program does nothing). INT4 weights are read as kernel-layout words [32, BN] per 256-wide K block
and dequantised in registers into 8 planes, one K=32 dot each; each group's scale multiplies the
dequantised weights (`scale_weights`, every tuned config) or the [BM, BN] f32 dot output. With
`min_bm` a block multiplies only the smallest power-of-two prefix of rows holding its real rows.
1. gate_up: h[row] = SiLU(x[token] @ Wg) * (x[token] @ Wu), x gathered by token in the kernel.
2. down: y[row] = w_row * (h[row] @ Wd), float32.
INT4 experts with float16 scales (`int4.to_kernel_layout(scale_dtype=float16)`) multiply in float16:
its 10-bit mantissa holds an odd plane's nibble in place (`dequant.asm_source_f16`: no shift) and
rounds the dequantised weights 8x finer than bf16. bf16 activations are then scaled per row by a
power of two into float16's range (`to_f16_rows`, exact), gate_up writes float32 h, and the scales
are undone in gate_up's epilogue and in down's row weights.
Only real rows (row_token >= 0) are loaded and written: at decode sizes most rows of a block are
padding (T = 64, top-8: 512 real rows of 6,272), whose activation reads and output writes would
otherwise add to the weight stream.
The top-k results are then summed per token (xla.combine): deterministic, no atomics.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels import registry
from pallas_kernels.moe import int4, tuning
from pallas_kernels.moe.align import align_routing
from pallas_kernels.moe.dequant import plane
from pallas_kernels.moe.experts import Dims, check_moe_inputs, dims as expert_dims
from pallas_kernels.moe.xla import combine
from pallas_kernels.pallas_compat import interpret_mode, pl, plgpu


def _col_block(n: int, bn: int) -> int:
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
    planes accumulate into one accumulator, instead of rescaling each plane's float32 dot output.
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
            for j in range(n_planes):
                a = load_a(kb * int4.KBLOCK + j * int4.PLANE, int4.PLANE)   # shared by gate and up
                for i, (_, qs) in enumerate(ws):
                    s = qs[e, kb * 8 + j, cols]
                    if cfg.scale_weights:
                        accs[i] = accs[i] + _dot(a, plane(words[i], j, dtype, route, s), swap)
                    else:
                        s = s.astype(jnp.float32)
                        d = _dot(a, plane(words[i], j, dtype, route), swap)
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
    return tuple(acc.T for acc in accs) if swap else accs


def _block_and_tile(cfg):
    """(row block b, column tile n) of this program: grid (b, n), or (n, b) with cfg.cols_first."""
    first, second = pl.program_id(0), pl.program_id(1)
    return (second, first) if cfg.cols_first else (first, second)


def _grid(blocks: int, tiles: int, cfg) -> tuple[int, int]:
    return (tiles, blocks) if cfg.cols_first else (blocks, tiles)


def block_rows(row_token, b, bm: int, min_bm: int):
    """Rows row block b's body multiplies (int32 scalar): the smallest of bm, bm / 2, ..., min_bm
    (min_bm 0: bm) holding the block's real rows, which are a prefix of it (padding rows end an
    expert's run). row_token [R]: a ref or array, -1 on padding rows."""
    m, size = jnp.int32(bm), bm // 2
    while min_bm and size >= min_bm:       # row `size` is padding: the real rows fit in `size`
        m = jnp.where(row_token[b * bm + size] < 0, jnp.int32(size), m)
        size //= 2
    return m


def _row_bodies(row_token_ref, b, e, bm, cfg, body):
    """body(m) for row block b of expert e (e < 0: nothing), m = block_rows(...): one body per
    candidate m in the kernel, so the dequantised weights serve an expert's few real rows once
    without multiplying the block's padding rows (cfg.min_bm)."""
    sizes = [bm]
    while cfg.min_bm and sizes[-1] > cfg.min_bm:
        sizes.append(sizes[-1] // 2)
    if len(sizes) == 1:
        pl.when(e >= 0)(functools.partial(body, bm))
        return
    m = block_rows(row_token_ref, b, bm, cfg.min_bm)
    for size in sizes:
        pl.when((e >= 0) & (m == size))(functools.partial(body, size))


def _gate_up_kernel(row_token_ref, block_expert_ref, x_ref, *refs, bm, bn, k, int4_weights, route,
                    cfg, aliased, scaled):
    if scaled:                                               # row_scale [R]: x rows were divided by it
        row_scale_ref, refs = refs[0], refs[1:]
    n_out = 2 if cfg.split_k > 1 else 1                      # split: gate and up partial sums
    w_refs = refs[:len(refs) - n_out * (2 if aliased else 1)]  # an aliased input is never read
    out_refs = refs[len(refs) - n_out:]
    b, n = _block_and_tile(cfg)
    split = (pl.program_id(2), cfg.split_k) if cfg.split_k > 1 else None   # read outside pl.when
    e = block_expert_ref[b]

    def body(m):
        tokens = row_token_ref[pl.ds(b * bm, m)]
        real = (tokens >= 0)[:, None]
        tokens = jnp.maximum(tokens, 0)
        ws = [tuple(w_refs[i:i + 2]) for i in (0, 2)] if int4_weights else list(w_refs)
        g, u = _project(
            lambda k0, size: plgpu.load(
                x_ref.at[tokens[:, None], (k0 + jnp.arange(size))[None, :]], mask=real, other=0),
            ws, e, n * bn, m, bn, k, int4_weights=int4_weights, dtype=x_ref.dtype, route=route,
            cfg=cfg, split=split)
        rows, cols = pl.ds(b * bm, m), pl.ds(n * bn, bn)
        if scaled:
            c = row_scale_ref[rows][:, None]
            g, u = g * c, u * c
        mask = jnp.broadcast_to(real, g.shape)
        if split is None:
            plgpu.store(out_refs[0].at[rows, cols], _silu_mul(g, u).astype(out_refs[0].dtype),
                        mask=mask)
        else:
            plgpu.store(out_refs[0].at[split[0], rows, cols], g, mask=mask)
            plgpu.store(out_refs[1].at[split[0], rows, cols], u, mask=mask)

    _row_bodies(row_token_ref, b, e, bm, cfg, body)


def _silu_mul(g, u):
    return g / (1.0 + jnp.exp(-g)) * u


def _down_kernel(row_token_ref, row_weight_ref, block_expert_ref, h_ref, *refs, bm, bn, k,
                 int4_weights, route, cfg, aliased):
    w_refs, y_ref = refs[:-2 if aliased else -1], refs[-1]
    b, n = _block_and_tile(cfg)
    split = (pl.program_id(2), cfg.split_k) if cfg.split_k > 1 else None   # read outside pl.when
    e = block_expert_ref[b]

    def body(m):
        real = (row_token_ref[pl.ds(b * bm, m)] >= 0)[:, None]
        ws = [tuple(w_refs)] if int4_weights else list(w_refs)
        (y,) = _project(
            lambda k0, size: plgpu.load(h_ref.at[pl.ds(b * bm, m), pl.ds(k0, size)], mask=real,
                                        other=0),
            ws, e, n * bn, m, bn, k, int4_weights=int4_weights, dtype=h_ref.dtype, route=route,
            cfg=cfg, split=split)
        w = row_weight_ref[pl.ds(b * bm, m)]
        idx = (pl.ds(b * bm, m), pl.ds(n * bn, bn))
        plgpu.store(y_ref.at[idx if split is None else (split[0], *idx)], y * w[:, None],
                    mask=jnp.broadcast_to(real, y.shape))

    _row_bodies(row_token_ref, b, e, bm, cfg, body)


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


def to_f16_rows(a, real=None):
    """a [R, K] float -> (a / c as float16 [R, K], c [R] float32): c a power of two per row putting
    the row's largest magnitude in [2^14, 2^15) (1 for all-zero rows, and where `real` [R] is
    False, whose rows become zeros). Exact for bf16 inputs (8-bit significands; entries below
    2^-28 of the row's largest lose bits as float16 subnormals); float32 rounds to 11 bits."""
    a = a.astype(jnp.float32)
    if real is not None:
        a = jnp.where(real[:, None], a, 0.0)
    amax = jnp.max(jnp.abs(a), axis=1)
    _, ex = jnp.frexp(jnp.where(amax > 0, amax, 1.0))          # amax in [2^(ex-1), 2^ex)
    c = jnp.where(amax > 0, jnp.ldexp(jnp.float32(1), ex - 15), 1.0)
    return (a / c[:, None]).astype(jnp.float16), c


def gate_up(x, row_token, block_expert, experts, dm: Dims, cfg, out=None, row_scale=None):
    """h [R, I] x.dtype: SiLU(x[row_token] @ Wg[e]) * (x[row_token] @ Wu[e]) for every real row
    (row_token >= 0); padding rows are not written. row_scale [R] float32: x's rows were divided
    by it (`to_f16_rows`); the kernel multiplies g and u back, and h is float32.

    cfg.split_k > 1: the kernel writes float32 gate and up partial sums [split_k, R, I] (`out`: a
    pair of such buffers) and XLA reduces them and applies the epilogue.
    """
    bn = _col_block(dm.intermediate, cfg.check().bn_up)
    scaled = row_scale is not None
    kernel = functools.partial(_gate_up_kernel, bm=cfg.bm, bn=bn, k=dm.hidden, int4_weights=dm.int4,
                               route=_route(cfg, x.dtype), cfg=cfg, scaled=scaled)
    args = [row_token, block_expert, x, *([row_scale] if scaled else []),
            *_weights(experts, "gate", dm.int4), *_weights(experts, "up", dm.int4)]
    h_dtype = jnp.float32 if scaled else x.dtype
    grid = _grid(block_expert.shape[0], dm.intermediate // bn, cfg)
    rows = row_token.shape[0]
    if cfg.split_k == 1:
        shape = jax.ShapeDtypeStruct((rows, dm.intermediate), h_dtype)
        return _call(kernel, grid, shape, args, cfg, out)
    part = jax.ShapeDtypeStruct((cfg.split_k, rows, dm.intermediate), jnp.float32)
    g, u = _call(kernel, grid, (part, part), args, cfg, out)      # row_scale applied in the kernel
    return _silu_mul(g.sum(0), u.sum(0)).astype(h_dtype)


def down(h, row_token, row_weight, block_expert, experts, dm: Dims, cfg, out=None):
    """y [R, d] float32: row_weight[row] * (h[row] @ Wd[e]) for every real row (row_token >= 0);
    padding rows are neither read from h nor written.

    cfg.split_k > 1: the kernel writes partial sums [split_k, R, d] (`out`: such a buffer), summed here.
    """
    bn = _col_block(dm.hidden, cfg.check().bn_down)
    kernel = functools.partial(_down_kernel, bm=cfg.bm, bn=bn, k=dm.intermediate,
                               int4_weights=dm.int4, route=_route(cfg, h.dtype), cfg=cfg)
    args = [row_token, row_weight, block_expert, h, *_weights(experts, "down", dm.int4)]
    split = (cfg.split_k,) if cfg.split_k > 1 else ()
    shape = jax.ShapeDtypeStruct((*split, h.shape[0], dm.hidden), jnp.float32)
    y = _call(kernel, _grid(block_expert.shape[0], dm.hidden // bn, cfg), shape, args, cfg, out,
              cfg.down_warps, cfg.down_stages)
    return y.sum(0) if split else y


def routed_rows(topk_ids, topk_weights, num_experts: int, bm: int):
    """Align the routing: (routing, row_token [R] int32 (-1: a padding row), row_weight [R]
    float32 (0 on padding rows))."""
    t, k = topk_ids.shape
    r = align_routing(topk_ids, num_experts, bm)
    row_token = jnp.where(r.row_slot < t * k, r.row_slot // k, -1)
    w_slot = jnp.concatenate([topk_weights.reshape(-1).astype(jnp.float32), jnp.zeros((1,))])
    return r, row_token, w_slot[r.row_slot]


@functools.partial(jax.jit, static_argnames=("cfg",))
def moe_experts_pallas(x, topk_ids, topk_weights, experts, *, cfg: tuning.MoEConfig | None = None):
    """x [T, d], topk_ids [T, k], topk_weights [T, k], experts -> [T, d] x.dtype (cfg: tuning.config(T))."""
    dm = check_moe_inputs(x, topk_ids, topk_weights, experts)
    cfg = cfg or tuning.config(x.shape[0])
    r, row_token, row_weight = routed_rows(topk_ids, topk_weights, dm.num_experts, cfg.bm)
    if f16_compute(x.dtype, experts, cfg):   # rows into float16's range, undone in the epilogues
        x16, cx = to_f16_rows(x)
        real = row_token >= 0
        h = gate_up(x16, row_token, r.block_expert, experts, dm, cfg,
                    row_scale=jnp.where(real, cx[jnp.maximum(row_token, 0)], 1.0))
        h16, ch = to_f16_rows(h, real)
        y = down(h16, row_token, row_weight * ch, r.block_expert, experts, dm, cfg)
    else:
        h = gate_up(x, row_token, r.block_expert, experts, dm, cfg)
        y = down(h, row_token, row_weight, r.block_expert, experts, dm, cfg)
    return combine(y, r.slot_row, *topk_ids.shape, x.dtype)


def supports(x, topk_ids, topk_weights, experts) -> str | None:
    """Why the registered "pallas_triton" implementation cannot take these experts, or None."""
    dm = expert_dims(experts)
    if not dm.int4 and (dm.hidden % 16 or dm.intermediate % 16):
        return f"bf16 experts: d ({dm.hidden}) and I ({dm.intermediate}) must be multiples of 16"
    return None


registry.register("moe_experts", "pallas_triton", supports=supports)(
    lambda x, topk_ids, topk_weights, experts: moe_experts_pallas(x, topk_ids, topk_weights, experts))
