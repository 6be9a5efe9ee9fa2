"""Pallas:Triton MLA tree-verify attention (flash-decoding over the latent cache).

This file holds the one-pass kernel and the registered entry point; `select_config` sends
K2-size verify shapes to the two-pass GEMMs of two_pass.py instead, keeping this kernel for plain
decode (Q = 1, 64-row tiles once the stream-slots are many) and narrow latents.

Rows of a program are BLOCK_M consecutive (node, head) pairs of one stream (q viewed as
[S, Q*H, Dk]), so each K/V tile loaded from the shared latent head serves BLOCK_M query rows.
The latent [.., :v_dim] and rope [.., v_dim:] widths must be powers of two (512 + 64 for Kimi-K2).
The context is split across `num_splits` programs; each keeps an online softmax in float32 and,
when split, writes partial (acc, m, l) that an XLA combine merges. The last split also takes the
tree block: keys at slots ctx + t, 32 at a time, visible per row by one word of the node bitmask
(pre-expanded to rows as [S, W, Q*H]). Tile choices and the variants not taken:
docs/kernels/mla_attention.md.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from pallas_kernels import registry
from pallas_kernels.mla_attention.two_pass import (TwoPassConfig, fit_config, mla_attention_two_pass, row_masks,
                                                   score_chunk)
from pallas_kernels.pallas_compat import LOG2E, MIN_DOT_K, dot_f32, interpret_mode, pl, plgpu

_TREE_BLOCK = 32
_TARGET_PROGRAMS = 264          # about two waves of 132 SMs (H100 / H200)
_MIN_SPLIT = 256                # fewest cache slots worth a split of their own
_TWO_PASS_ROWS = 256            # select_config: (node, head) rows per stream, latent width and
_TWO_PASS_V_DIM = 256           # cache slots from which the two-pass path is used
_TWO_PASS_SLOTS = 1024
_WIDE_DECODE_SLOTS = 1 << 17    # select_config: streams x slots from which plain decode uses 64-row tiles


@dataclasses.dataclass(frozen=True)
class BlockConfig:
    """Tile sizes and launch parameters of the one-pass kernel; num_splits None picks by occupancy."""
    block_m: int = 32           # 32x64 with 4 warps: the fastest one-pass tile at K2 width
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2
    num_splits: int | None = None

    @classmethod
    def parse(cls, text: str) -> "BlockConfig":
        """'BMxBNxWARPSxSTAGES[sSPLITS]', e.g. '32x64x4x2', or '64x64x8x2s9' with 9 context splits."""
        tiles, _, splits = text.partition("s")
        dims = tiles.split("x")
        if (len(dims) != 4 or not all(d.isdigit() for d in dims)
                or not (text == tiles or splits.isdigit() and int(splits) > 0)):
            raise ValueError(f"one-pass config must read 'BMxBNxWARPSxSTAGES[sSPLITS]'; got {text!r}")
        bm, bn, warps, stages = map(int, dims)
        return cls(block_m=bm, block_n=bn, num_warps=warps, num_stages=stages,
                   num_splits=int(splits) if splits else None)

    @property
    def name(self) -> str:
        """The inverse of parse."""
        splits = f"s{self.num_splits}" if self.num_splits else ""
        return f"{self.block_m}x{self.block_n}x{self.num_warps}x{self.num_stages}{splits}"


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def parse_config(text: str) -> "BlockConfig | TwoPassConfig":
    """A config by name: 'tp...' is the two-pass path (TwoPassConfig.parse), anything else the
    one-pass kernel (BlockConfig.parse)."""
    return TwoPassConfig.parse(text) if text.startswith("tp") else BlockConfig.parse(text)


def select_config(rows: int, num_slots: int, v_dim: int, num_s: int = 1, rope: int = 64,
                  dtype=jnp.bfloat16) -> "BlockConfig | TwoPassConfig":
    """rows (node, head) pairs per stream over num_slots cache slots, num_s streams, rope width,
    query dtype -> the config `mla_attention_pallas` runs.

    The two-pass GEMMs (two_pass.py, TwoPassConfig's 128x256 score tiles at every such shape) for
    K2-class widths once a stream has >= 256 rows over >= 1024 slots; the one-pass kernel
    otherwise. Plain decode (<= 64 rows) over >= 2^17 stream-slots takes 64-row tiles (every head
    of a stream in one program, the cache read once); below that, 32-row tiles, whose fewer
    context splits keep the float32 partials small. A 16-bit rope narrower than MIN_DOT_K keeps
    the one-pass kernel, whose small tiles afford `dot_f32`'s broadcast product for it. The
    measurements behind each threshold: docs/kernels/mla_attention.md."""
    narrow_16bit = rope < MIN_DOT_K and jnp.dtype(dtype).itemsize == 2
    if (rows >= _TWO_PASS_ROWS and v_dim >= _TWO_PASS_V_DIM and num_slots >= _TWO_PASS_SLOTS
            and not narrow_16bit):
        return TwoPassConfig()
    if rows <= 64 and v_dim >= _TWO_PASS_V_DIM and num_s * num_slots >= _WIDE_DECODE_SLOTS:
        return BlockConfig(block_m=64, block_n=64, num_warps=8, num_stages=2)
    return BlockConfig()


def default_splits(num_s: int, rows: int, num_slots: int, block_m: int) -> int:
    programs = num_s * -(-rows // block_m)
    want = -(-_TARGET_PROGRAMS // programs)
    return max(1, min(want, num_slots // _MIN_SPLIT))


def _update(carry, s, v):
    m, l, acc = carry
    m_new = jnp.maximum(m, s.max(axis=1))
    m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
    p = jnp.exp2(s - m_safe[:, None])          # s and m in log2 units (see pallas_compat.LOG2E)
    alpha = jnp.exp2(m - m_safe)
    acc = acc * alpha[:, None] + dot_f32(p.astype(v.dtype), v, 0)
    return m_new, l * alpha + p.sum(axis=1), acc


def _kernel(ctx_ref, q_ref, qr_ref, kv_ref, mask_ref, *out_refs, scale, v_dim, rope, rope_col, num_q,
            rows, num_slots, block_m, block_n, split_len, num_splits):
    # q_ref holds the latent part in columns [0, v_dim); qr_ref the rope part in [rope_col,
    # rope_col + rope): q_ref itself (rope_col = v_dim) or the separate q_rope (rope_col = 0).
    split = pl.program_id(1)
    ctx = ctx_ref[()]
    r0 = pl.program_id(0) * block_m
    row_ok = r0 + jnp.arange(block_m) < rows
    q_lat = plgpu.load(q_ref.at[pl.ds(r0, block_m), pl.ds(0, v_dim)], mask=row_ok[:, None], other=0)
    q_pe = plgpu.load(qr_ref.at[pl.ds(r0, block_m), pl.ds(rope_col, rope)], mask=row_ok[:, None], other=0)

    def scores(start, key_ok, n):
        """Scaled scores [block_m, n] of keys start..start+n, and their values [n, v_dim]."""
        rows_k = pl.ds(start, n)
        k_lat = plgpu.load(kv_ref.at[rows_k, pl.ds(0, v_dim)], mask=key_ok[:, None], other=0)
        k_pe = plgpu.load(kv_ref.at[rows_k, pl.ds(v_dim, rope)], mask=key_ok[:, None], other=0)
        return (dot_f32(q_lat, k_lat, 1) + dot_f32(q_pe, k_pe, 1)) * scale, k_lat

    lo = split * split_len
    hi = jnp.minimum(lo + split_len, ctx)

    def ctx_body(i, carry):
        start = lo + i * block_n
        key_ok = start + jnp.arange(block_n) < hi
        s, v = scores(start, key_ok, block_n)
        return _update(carry, jnp.where(key_ok[None, :], s, -jnp.inf), v)

    last_split = split == num_splits - 1
    num_words = -(-num_q // _TREE_BLOCK)

    def tree_body(w, carry):
        """Tree keys ctx + 32w .., visible per row by bitmask word w."""
        t = w * _TREE_BLOCK + jnp.arange(_TREE_BLOCK)
        key_ok = (t < num_q) & (ctx + t < num_slots) & last_split
        s, v = scores(ctx + w * _TREE_BLOCK, key_ok, _TREE_BLOCK)
        word = plgpu.load(mask_ref.at[w, pl.ds(r0, block_m)], mask=row_ok, other=0)
        bit = (word[:, None] >> jnp.arange(_TREE_BLOCK)[None, :]) & 1
        return _update(carry, jnp.where((bit != 0) & key_ok[None, :], s, -jnp.inf), v)

    carry = (jnp.full((block_m,), -jnp.inf, jnp.float32), jnp.zeros((block_m,), jnp.float32),
             jnp.zeros((block_m, v_dim), jnp.float32))
    carry = jax.lax.fori_loop(0, jnp.maximum(hi - lo + block_n - 1, 0) // block_n, ctx_body, carry)
    m, l, acc = jax.lax.fori_loop(0, last_split.astype(jnp.int32) * num_words, tree_body, carry)

    rows_o = pl.ds(r0, block_m)
    if num_splits == 1:
        (o_ref,) = out_refs
        out = jnp.where(l[:, None] > 0, acc / jnp.where(l > 0, l, 1.0)[:, None], 0.0)
        plgpu.store(o_ref.at[rows_o, pl.ds(0, v_dim)], out.astype(o_ref.dtype), mask=row_ok[:, None])
    else:
        acc_ref, m_ref, l_ref = out_refs
        plgpu.store(acc_ref.at[rows_o, pl.ds(0, v_dim)], acc, mask=row_ok[:, None])
        plgpu.store(m_ref.at[rows_o], m, mask=row_ok)
        plgpu.store(l_ref.at[rows_o], l, mask=row_ok)


def _combine(acc, m, l):
    """Partials acc [S,P,R,V], m (log2 units) and l [S,P,R] of P context splits -> normalised [S,R,V]
    float32."""
    m_max = m.max(axis=1, keepdims=True)
    w = jnp.where(m == -jnp.inf, 0.0, jnp.exp2(m - jnp.where(m_max == -jnp.inf, 0.0, m_max)))
    total = (w * l).sum(axis=1)
    out = (w[..., None] * acc).sum(axis=1)
    return jnp.where(total[..., None] > 0, out / jnp.where(total > 0, total, 1.0)[..., None], 0.0)


@functools.partial(jax.jit, static_argnames=("scale", "v_dim", "config", "poison", "heads_first"))
def mla_attention_pallas(q, kv, ctx_lens, node_mask, *, scale: float, v_dim: int,
                         config: "BlockConfig | TwoPassConfig | None" = None, poison: bool = False,
                         heads_first: bool = False, q_rope=None) -> jax.Array:
    """q [S,Q,H,Dk], kv [S,N,Dk], ctx_lens [S] int32, node_mask [S,Q,W] int32 -> [S,Q,H,v_dim].

    config: a BlockConfig runs the one-pass kernel, a TwoPassConfig the two-pass GEMMs
    (two_pass.py); None picks by shape (select_config).

    heads_first: q [S,H,Q,Dk] -> [S,H,Q,v_dim] (rows ordered (head, node); the layout a batched
    per-head matmul produces, so the caller needs no transpose). q_rope: the rope part
    [.., Dk - v_dim] as its own input, q holding the latent part [.., v_dim] (the kernel reads the
    two parts with separate loads either way). poison=True hands the kernel NaN-filled output
    buffers (aliased), so unwritten rows show.
    """
    if heads_first:
        num_s, num_h, num_q, dk = q.shape
    else:
        num_s, num_q, num_h, dk = q.shape
    if q_rope is not None:
        dk = q.shape[-1] + q_rope.shape[-1]
    num_slots = kv.shape[1]
    rope = dk - v_dim
    if why := _dims_supported(dk, v_dim):
        raise ValueError(f"pallas_triton mla_attention {why}")
    rows = num_q * num_h
    config = config or select_config(rows, num_slots, v_dim, num_s, rope, q.dtype)
    q_rows = q.reshape(num_s, rows, q.shape[-1])
    qr_rows = q_rows if q_rope is None else q_rope.reshape(num_s, rows, rope)
    lead = (num_h, num_q) if heads_first else (num_q, num_h)
    if isinstance(config, TwoPassConfig):
        config = fit_config(config, v_dim)
        row_mask = row_masks(node_mask, num_h, heads_first, config)
        if q_rope is not None and rope == score_chunk(v_dim):
            # one [R, Dk] query lets the scores GEMM take the rope chunk inside its pipelined loop
            # (faster than a separate rope dot); the concatenation costs a copy of q
            q_rows = qr_rows = jnp.concatenate([q_rows, qr_rows], axis=-1)
            q_rope = None
        out = mla_attention_two_pass(q_rows, qr_rows, kv, ctx_lens, row_mask, scale=scale, v_dim=v_dim,
                                     rope=rope, rope_col=v_dim if q_rope is None else 0, num_q=num_q,
                                     config=config, poison=poison)
        return out.reshape(num_s, *lead, v_dim)
    bm, bn = config.block_m, config.block_n
    splits = config.num_splits or default_splits(num_s, rows, num_slots, bm)
    split_len = -(-(-(-num_slots // splits)) // bn) * bn
    if heads_first:   # row h*Q + n is node n
        row_mask = jnp.tile(node_mask.transpose(0, 2, 1), (1, 1, num_h))  # [S, W, H*Q]
    else:             # row n*H + h is node n
        row_mask = jnp.repeat(node_mask, num_h, axis=1).transpose(0, 2, 1)  # [S, W, Q*H]

    grid = (-(-rows // bm), splits, num_s)
    stream = lambda b, p, s: (s, 0, 0)
    in_specs = [pl.BlockSpec((None,), lambda b, p, s: (s,)),
                pl.BlockSpec((None, rows, q_rows.shape[-1]), stream),
                pl.BlockSpec((None, rows, qr_rows.shape[-1]), stream),
                pl.BlockSpec((None, num_slots, dk), stream),
                pl.BlockSpec((None, row_mask.shape[1], rows), stream)]
    if splits == 1:
        out_shape = [jax.ShapeDtypeStruct((num_s, rows, v_dim), q.dtype)]
        out_specs = [pl.BlockSpec((None, rows, v_dim), stream)]
    else:
        out_shape = [jax.ShapeDtypeStruct((num_s, splits, rows, v_dim), jnp.float32),
                     jax.ShapeDtypeStruct((num_s, splits, rows), jnp.float32),
                     jax.ShapeDtypeStruct((num_s, splits, rows), jnp.float32)]
        out_specs = [pl.BlockSpec((None, None, rows, v_dim), lambda b, p, s: (s, p, 0, 0)),
                     pl.BlockSpec((None, None, rows), lambda b, p, s: (s, p, 0)),
                     pl.BlockSpec((None, None, rows), lambda b, p, s: (s, p, 0))]
    args = [ctx_lens, q_rows, qr_rows, kv, row_mask]
    aliases = {}
    if poison:
        aliases = {len(args) + i: i for i in range(len(out_shape))}
        args += [jnp.full(o.shape, jnp.nan, o.dtype) for o in out_shape]
        in_specs += out_specs
    kernel = functools.partial(
        _kernel, scale=scale * LOG2E, v_dim=v_dim, rope=rope, rope_col=v_dim if q_rope is None else 0,
        num_q=num_q, rows=rows, num_slots=num_slots, block_m=bm, block_n=bn, split_len=split_len,
        num_splits=splits)
    if poison:
        kernel = _drop_aliased_inputs(kernel, len(out_shape))
    outs = pl.pallas_call(
        kernel, grid=grid, in_specs=in_specs, out_specs=out_specs, out_shape=out_shape,
        input_output_aliases=aliases, interpret=interpret_mode(), name="mla_tree_attention",
        compiler_params=plgpu.CompilerParams(num_warps=config.num_warps, num_stages=config.num_stages),
    )(*args)
    out = outs[0] if splits == 1 else _combine(*outs)
    return out.reshape(num_s, *lead, v_dim).astype(q.dtype)


def _drop_aliased_inputs(kernel, n):
    """The poison buffers arrive as the last n inputs; the kernel writes their aliased outputs."""
    def wrapped(*refs):
        return kernel(*refs[:5], *refs[5 + n:])
    return wrapped


def _dims_supported(dk: int, v_dim: int) -> str | None:
    if _is_pow2(v_dim) and _is_pow2(dk - v_dim):
        return None
    return f"needs power-of-two v_dim and Dk - v_dim; got v_dim={v_dim}, Dk={dk}"


def supports(q, kv, ctx_lens, node_mask, *, scale: float, v_dim: int, heads_first: bool = False,
             q_rope=None, balance: bool = False) -> str | None:
    """Why the registered "pallas_triton" implementation cannot take this call, or None."""
    del kv, ctx_lens, node_mask, scale, heads_first, balance
    return _dims_supported(q.shape[-1] + (0 if q_rope is None else q_rope.shape[-1]), v_dim)


@registry.register("mla_attention", "pallas_triton", supports=supports)
def _registered(q, kv, ctx_lens, node_mask, *, scale: float, v_dim: int,
                heads_first: bool = False, q_rope=None, balance: bool = False) -> jax.Array:
    del balance     # the registry's scheduling hint (mla_attention): this kernel's programs are per stream
    return mla_attention_pallas(q, kv, ctx_lens, node_mask, scale=scale, v_dim=v_dim,
                                heads_first=heads_first, q_rope=q_rope)
