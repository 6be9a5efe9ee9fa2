"""Pallas:Triton drafter_qkv: one kernel, programs over (row block, output head).

Rows are the B*T tokens. Program (r, j) loads its block of rows [bm, d] (bm a power of two >= 16,
the smallest M of a Triton dot), applies the input RMSNorm when given, and produces output head j
of [q heads | k heads | v heads]: the head's two halves (columns [0, hd/2) and [hd/2, hd) of its
weight slice) as two dots, the per-head RMSNorm over both halves and the rotate-half RoPE for q
and k, and stores them straight into q/k/v laid out [rows, heads, hd]. Every intermediate is
rounded to x's dtype where the module form rounds it (after each product and each norm), so the
kernel agrees with the "xla" implementation to rounding.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels import registry
from pallas_kernels.pallas_compat import dot_f32, interpret_mode, pl, plgpu

BLOCK_ROWS = 16   # rows per program: one dot tile, so even 16 streams spread over many SMs


def _pow2_at_least(n: int, floor: int = 1) -> int:
    return max(floor, 1 << max(0, (n - 1).bit_length()))


def _kernel(x_ref, pos_ref, freq_ref, *refs, rows: int, d: int, hd: int, nq: int, nkv: int,
            bm: int, has_norm: bool, eps: float):
    refs = list(refs)
    q_ref, k_ref, v_ref = ([refs[-3]] if nq else [None]) + refs[-2:]   # outputs come last (after
    norm_ref = refs.pop(0) if has_norm else None                     # the poisoned aliases, if any)
    wq_ref, qn_ref = (refs.pop(0), refs.pop(0)) if nq else (None, None)
    wk_ref, wv_ref, kn_ref = refs[:3]
    r, j = pl.program_id(0), pl.program_id(1)          # read outside pl.when
    half, dp, dt = hd // 2, _pow2_at_least(d), x_ref.dtype
    row = r * bm + jnp.arange(bm)
    rok = row < rows
    col = jnp.arange(dp)
    cok = col < d
    x = plgpu.load(x_ref.at[row[:, None], col[None, :]], mask=rok[:, None] & cok[None, :], other=0)
    if has_norm:
        xf = x.astype(jnp.float32)
        inv = jax.lax.rsqrt(jnp.sum(xf * xf, axis=1) / d + eps)
        scale = plgpu.load(norm_ref.at[col], mask=cok, other=0).astype(jnp.float32)
        x = (xf * inv[:, None] * scale[None, :]).astype(dt)
    ang = (plgpu.load(pos_ref.at[row], mask=rok, other=0).astype(jnp.float32)[:, None]
           * plgpu.load(freq_ref.at[jnp.arange(half)])[None, :])
    cos, sin = jnp.cos(ang), jnp.sin(ang)
    lo_cols, hi_cols = jnp.arange(half), half + jnp.arange(half)

    def project(w_ref, head):
        """The head's halves of x @ w, rounded to x's dtype as the module's Linear is."""
        def part(cols):
            w = plgpu.load(w_ref.at[col[:, None], (head * hd + cols)[None, :]], mask=cok[:, None],
                           other=0).astype(dt)
            y = dot_f32(x, w, 0)
            return y.astype(dt).astype(jnp.float32)
        return part(lo_cols), part(hi_cols)

    def turn(lo, hi, n_ref):
        """The per-head RMSNorm (rounded to x's dtype), then RoPE."""
        inv = jax.lax.rsqrt((jnp.sum(lo * lo, axis=1) + jnp.sum(hi * hi, axis=1)) / hd + eps)
        nlo = plgpu.load(n_ref.at[lo_cols]).astype(jnp.float32)
        nhi = plgpu.load(n_ref.at[hi_cols]).astype(jnp.float32)
        lo = (lo * inv[:, None] * nlo[None, :]).astype(dt).astype(jnp.float32)
        hi = (hi * inv[:, None] * nhi[None, :]).astype(dt).astype(jnp.float32)
        return lo * cos - hi * sin, lo * sin + hi * cos

    def store(o_ref, head, lo, hi):
        for cols, part in ((lo_cols, lo), (hi_cols, hi)):
            plgpu.store(o_ref.at[row[:, None], head, cols[None, :]], part.astype(o_ref.dtype),
                        mask=jnp.broadcast_to(rok[:, None], part.shape))

    if nq:
        @pl.when(j < nq)
        def _():
            store(q_ref, j, *turn(*project(wq_ref, j), qn_ref))

    kj = j - nq

    @pl.when((kj >= 0) & (kj < nkv))
    def _():
        store(k_ref, kj, *turn(*project(wk_ref, kj), kn_ref))

    @pl.when(kj >= nkv)
    def _():
        store(v_ref, kj - nkv, *project(wv_ref, kj - nkv))


def drafter_qkv_pallas(x, positions, wq, wk, wv, q_norm, k_norm, inv_freq, *, norm, eps: float,
                       block_rows: int = BLOCK_ROWS, num_warps: int = 4, poison: bool = False):
    """See the package docstring. block_rows: rows per program at most (a power of two >= 16);
    poison: outputs start as NaN (tests: every element must be written)."""
    bsz, t, d = x.shape
    hd = k_norm.shape[0]
    if why := _head_dim_supported(hd):
        raise ValueError(f"pallas_triton drafter_qkv {why}")
    nq = 0 if wq is None else wq.shape[1] // hd
    nkv = wk.shape[1] // hd
    rows = bsz * t
    bm = min(block_rows, _pow2_at_least(rows, 16))
    ins = [x.reshape(rows, d), positions.reshape(rows).astype(jnp.int32), inv_freq]
    ins += [norm] if norm is not None else []
    ins += [wq, q_norm] if nq else []
    ins += [wk, wv, k_norm]
    shapes = ([(rows, nq, hd)] if nq else []) + [(rows, nkv, hd)] * 2
    outs = tuple(jax.ShapeDtypeStruct(s, x.dtype) for s in shapes)
    kernel = functools.partial(_kernel, rows=rows, d=d, hd=hd, nq=nq, nkv=nkv, bm=bm,
                               has_norm=norm is not None, eps=eps)
    call = pl.pallas_call(
        kernel, out_shape=outs, grid=(pl.cdiv(rows, bm), nq + 2 * nkv),
        input_output_aliases={len(ins) + i: i for i in range(len(outs))} if poison else {},
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
        interpret=interpret_mode(), name="drafter_qkv" if nq else "drafter_kv")  # profiles' names
    got = call(*ins, *(jnp.full(s.shape, jnp.nan, s.dtype) for s in outs)) if poison else call(*ins)
    got = [o.reshape(bsz, t, -1, hd) for o in got]
    return (got[0] if nq else None), got[-2], got[-1]


def _head_dim_supported(hd: int) -> str | None:
    half = hd // 2
    if hd % 2 or half & (half - 1):
        return f"needs head_dim = 2 x a power of two (k_norm's length); got head_dim={hd}"
    return None


def supports(x, positions, wq, wk, wv, q_norm, k_norm, inv_freq, **kwargs) -> str | None:
    """Why the registered "pallas_triton" implementation cannot take this call, or None."""
    return _head_dim_supported(k_norm.shape[0])


registry.register("drafter_qkv", "pallas_triton", supports=supports)(drafter_qkv_pallas)
