"""The split runs' merge as one Pallas:Triton kernel (the alternative to XLA's `combine_splits`).

`mosaic_gpu.context_attention(splits=K)` leaves W = S * K parts: O [W, R, v] (bf16 or float32, each
normalised by its own row sum) and lse2 [W, R] float32 (log2 units, -inf for a run that saw no
key), stream s's parts at s * K .. s * K + K - 1, or with balance at first[s] .. first[s] +
count[s] - 1 of `runs.run_schedule` (K each when the contexts are equal; a long stream more). The
merge weights part k by 2^(lse2_k - max_k lse2_k). XLA runs it as 2-5 small kernels (reductions
of different shapes do not fuse); here one kernel does it. Program (s, row block, column block)
finds its stream's parts (with balance from the contexts: the kernel's rule, scalar ops) and
reduces them in one of two forms (`form_for` picks by the runs per stream):
- "rows" (`_kernel`): one warp per program walks the parts in series, kc independent [BR, BC]
  loads per step so that the partial sums stay in each thread's registers (a [kc, BR, BC] tile
  reduced over its first axis compiles to shuffles and a shared-memory round trip per step);
  first the row maxima from lse2, then the weighted sums. Best up to ROWS_MAX_PARTS parts.
- "parts" (`_kernel_parts`): one online pass over [kc, 8, BC] tiles with several warps, so more
  parts are in flight at once. Best above.
The grid gives the GPU enough programs even for one stream (8 rows x 64 or 32 columns each).
Timings of both forms against XLA: docs/kernels/mla_attention.md.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels.mla_attention.runs import stream_runs, total_pairs
from pallas_kernels.pallas_compat import interpret_mode, pl, plgpu

BR = 8              # rows per program
MIN_PROGRAMS = 264  # two per SM of an H100 / H200: below, programs take 32 columns instead of 64


def _stream_parts(ctx_ref, num_q: int, width: int, balance: bool):
    """(first part, parts) of this program's stream (program axis 0): width / S each, or (balance)
    under runs.run_schedule from the S contexts in ctx_ref (scalar loads: the kernel's own rule,
    no schedule passed in)."""
    num_s = ctx_ref.shape[0]
    if not balance:
        return pl.program_id(0) * (width // num_s), width // num_s
    totals = [total_pairs(ctx_ref[j], num_q) for j in range(num_s)]
    return stream_runs(totals, width, pl.program_id(0))


def _kernel(o_ref, lse_ref, ctx_ref, *refs, num_q: int, balance: bool, br: int, bc: int, kc: int):
    out_ref = refs[-1]                                  # refs: (out,) or (aliased out, out)
    s, rb, cb = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    rows, cols = pl.ds(rb * br, br), pl.ds(cb * bc, bc)
    first, parts = _stream_parts(ctx_ref, num_q, o_ref.shape[0], balance)
    steps = -(-parts // kc) if isinstance(parts, int) else jax.lax.div(parts + kc - 1, kc)

    def part(k):
        return first + jnp.minimum(k, parts - 1)

    def lse_at(k):
        return plgpu.load(lse_ref.at[part(k), rows], mask=jnp.full((br,), k < parts), other=-jnp.inf)

    def top_step(c, m):
        for i in range(kc):
            m = jnp.maximum(m, lse_at(c * kc + i))
        return m

    top = jax.lax.fori_loop(0, steps, top_step, jnp.full((br,), -jnp.inf, jnp.float32))
    ref = jnp.where(top == -jnp.inf, 0.0, top)          # a row no part saw: every weight 0

    def add_step(c, carry):
        acc, den = carry
        for i in range(kc):
            k = c * kc + i
            w = jnp.exp2(lse_at(k) - ref)                                               # [br]
            o = plgpu.load(o_ref.at[part(k), rows, cols], mask=jnp.full((br, bc), k < parts), other=0)   # [br, bc]
            acc, den = acc + w[:, None] * o.astype(jnp.float32), den + w
        return acc, den

    acc, den = jax.lax.fori_loop(0, steps, add_step, (jnp.zeros((br, bc), jnp.float32),
                                                      jnp.zeros((br,), jnp.float32)))
    out_ref[s, rows, cols] = (acc / jnp.where(den > 0, den, 1.0)[:, None]).astype(out_ref.dtype)


def _kernel_parts(o_ref, lse_ref, ctx_ref, *refs, num_q: int, balance: bool, br: int, bc: int, kc: int):
    """form="parts": one pass; each step loads kc parts as one [kc, br] lse tile and one
    [kc, br, bc] O tile, rescales the running sums to the new row maxima (online, as flash
    attention does) and adds the tile reduced over its parts. The last step's parts past the
    stream's are masked off (their loads predicated away: no memory traffic, no read past the
    arrays)."""
    out_ref = refs[-1]
    s, rb, cb = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    rows, cols = pl.ds(rb * br, br), pl.ds(cb * bc, bc)
    first, parts = _stream_parts(ctx_ref, num_q, o_ref.shape[0], balance)

    def step(c, carry):
        top, acc, den = carry                                                          # [br], [br, bc], [br]
        start = c * kc
        real = start + jax.lax.broadcasted_iota(jnp.int32, (kc, br), 0) < parts     # [kc, br]
        lse = plgpu.load(lse_ref.at[pl.ds(first + start, kc), rows], mask=real, other=-jnp.inf)     # [kc, br]
        o = plgpu.load(o_ref.at[pl.ds(first + start, kc), rows, cols],
                       mask=jnp.broadcast_to(real[:, :, None], (kc, br, bc)), other=0).astype(jnp.float32)
        new_top = jnp.maximum(top, lse.max(0))
        ref = jnp.where(new_top == -jnp.inf, 0.0, new_top)                             # no key yet: weights 0
        w, keep = jnp.exp2(lse - ref[None]), jnp.exp2(top - ref)
        return new_top, acc * keep[:, None] + (w[:, :, None] * o).sum(0), den * keep + w.sum(0)

    init = (jnp.full((br,), -jnp.inf, jnp.float32), jnp.zeros((br, bc), jnp.float32), jnp.zeros((br,), jnp.float32))
    steps = -(-parts // kc) if isinstance(parts, int) else jax.lax.div(parts + kc - 1, kc)
    _, acc, den = jax.lax.fori_loop(0, steps, step, init)
    out_ref[s, rows, cols] = (acc / jnp.where(den > 0, den, 1.0)[:, None]).astype(out_ref.dtype)


FORMS = ("rows", "parts")   # _kernel (one part per load, two passes) or _kernel_parts
STEP = {"rows": (16, 1), "parts": (32, 4)}   # form -> (kc parts per loop step, warps per program)
ROWS_MAX_PARTS = 16
ROW_BLOCKS = 128    # "rows" programs per column block (S x R / br) that rows_per_program aims at
ROWS_WARPS = {8: 1, 16: 2, 32: 2, 64: 4}   # "rows" form: warps per program by its rows


def rows_per_program(num_s: int, rows: int, form: str) -> int:
    """br for merge_splits: "rows" doubles it from 8 up to 64 while the S x R rows make more than
    ROW_BLOCKS blocks of it, so wide calls run ~1,000 programs of more rows, not 8,000 one-warp
    programs of 8; decode and one stream keep 8 ("parts": always 8). Timings:
    docs/kernels/mla_attention.md."""
    br = BR
    while form == "rows" and br < 64 and num_s * rows > ROW_BLOCKS * br and rows % (2 * br) == 0:
        br *= 2
    return br


def form_for(parts: int) -> str:
    """The merge form for `parts` runs per stream: "rows" up to ROWS_MAX_PARTS, "parts" above.
    The rule's pick is never slower than XLA's merge (docs/kernels/mla_attention.md)."""
    return "rows" if parts <= ROWS_MAX_PARTS else "parts"


@functools.partial(jax.jit, static_argnames=("out_dtype", "num_q", "balance", "kc", "warps", "form", "br"))
def merge_splits(o, lse, ctx_lens, out_dtype=jnp.float32, out=None, *, num_q: int, balance: bool = False,
                 form: str | None = None, kc: int | None = None, warps: int | None = None,
                 br: int | None = None):
    """O [W, R, v] (any float dtype), lse2 [W, >= R] float32 (the first R rows read): the parts of
    `mosaic_gpu.context_attention(splits=W / S, balance)` for contexts ctx_lens [S] int32 and num_q
    tree tokens -> O [S, R, v] out_dtype, stream s's parts (W / S from s * W / S, or with balance
    by runs.run_schedule) merged by log-sum-exp in float32 (zeros where no part saw a key);
    R % 8 == 0, v % 32 == 0, W % S == 0.
    out: a buffer of the result's shape and dtype to write into (e.g. NaN-poisoned, in tests);
    form: FORMS (None: `form_for(W / S)`, the runs per stream on average); kc: parts per loop
    step (a power of two; "parts" takes at most the largest power of two <= W / S) and warps per
    program (None: STEP[form], or for "rows" ROWS_WARPS[br]); br: rows per program (a power of
    two >= 8 dividing R; a step loads kc * 8 / br parts then, so a thread holds about as many
    values; None: `rows_per_program`)."""
    width, rows, v = o.shape
    num_s = ctx_lens.shape[0] if ctx_lens.ndim == 1 else -1
    if num_s < 1 or width % num_s:
        raise ValueError(f"ctx_lens: expected [S] with W={width} a multiple of S, got {ctx_lens.shape}")
    form = form_for(width // num_s) if form is None else form
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    br = rows_per_program(num_s, rows, form) if br is None else br
    if warps is None:
        warps = ROWS_WARPS.get(br, STEP[form][1]) if form == "rows" else STEP[form][1]
    kc = STEP[form][0] if kc is None else kc
    if kc < 1 or kc & (kc - 1):
        raise ValueError(f"kc must be a power of two, got {kc}")
    if lse.ndim != 2 or lse.shape[0] != width or lse.shape[1] < rows or lse.dtype != jnp.float32:
        raise ValueError(f"lse: expected float32 [{width}, >= {rows}], got {lse.dtype} {lse.shape}")
    if rows % BR or v % 32:
        raise ValueError(f"o: rows ({rows}) must be a multiple of {BR} and v ({v}) of 32")
    if br < BR or br & (br - 1) or rows % br:
        raise ValueError(f"br must be a power of two >= {BR} dividing the rows ({rows}), got {br}")
    kc = max(1, kc * BR // br)
    bc = 64 if v % 64 == 0 and num_s * (rows // br) * (v // 64) >= MIN_PROGRAMS else 32
    shape = jax.ShapeDtypeStruct((num_s, rows, v), out_dtype)
    if out is not None and (out.shape, out.dtype) != (shape.shape, shape.dtype):
        raise ValueError(f"out: expected {shape.dtype} {shape.shape}, got {out.dtype} {out.shape}")
    if form == "parts":
        per = max(width // num_s, 1)
        kernel = functools.partial(_kernel_parts, kc=min(kc, 1 << (per.bit_length() - 1)))
    else:
        kernel = functools.partial(_kernel, kc=kc)
    return pl.pallas_call(
        functools.partial(kernel, num_q=num_q, balance=balance, br=br, bc=bc),
        out_shape=shape, grid=(num_s, rows // br, v // bc),
        input_output_aliases={} if out is None else {3: 0},
        compiler_params=plgpu.CompilerParams(num_warps=warps, num_stages=2),
        interpret=interpret_mode(),
    )(o, lse, ctx_lens.astype(jnp.int32), *([] if out is None else [out]))
