"""Two-pass Pallas:Triton MLA tree-verify attention: a scores GEMM, then a P @ V GEMM.

The one-pass (flash) kernel carries a [rows, v_dim] float32 accumulator beside the QK^T tile; at
Kimi-K2's v_dim = 512 that leaves 32-row tiles that under-use the tensor cores. Tree verification
is compute-bound (about 121 x Q FLOP per byte of latent cache), so this path spends memory
bandwidth to let both matmuls run as plain, large-tile GEMMs:

1. scores (grid: key tile x row block x stream): S = scale * q @ k^T for a [score_m, score_n]
   tile, masked, then P = exp(S - m_tile) written as [S, R, T * score_n] in kv.dtype, with the
   tile's row max m (in log2 units: every exponential is an exp2) and row sum l ([S, T, R]
   float32). Two launches: the whole context tiles with no masking at all, then the "edge" tiles
   (the partial last context tile and the tree tiles, which carry the key bounds and the ancestor
   bitmask) writing into the first launch's buffers.
2. P @ V (grid: value column block x [split x] row block x stream): each program first folds its
   rows' (m, l) over the stream's tiles into the row max and sum, then accumulates
   sum over tiles of (exp(m_tile - m_row) / l_row * P_tile) @ V_tile with a float32 accumulator
   only pv_v wide (P scaled in kv.dtype: one multiply per two scores). With few programs (one
   stream, few rows) the context is split across programs; the factors are already global, so
   the float32 partials simply add.

Key tiles of a stream: ceil(ctx / score_n) context tiles (slots n * score_n ..), then
ceil(Q / score_n) tree tiles whose columns are tree tokens t = 0 .. (slots ctx + t), so a tree
tile's columns line up with the bitmask's words. Programs past a stream's tiles do nothing, and
pass 2 reads none of their (unwritten) P, m, l. Extra traffic: P written and read once (4 bytes
per score for bf16) against 2 * (Dk + v_dim) FLOPs per score, so both GEMMs stay compute-bound.
P's memory is bounded by running groups of streams in turn (_P_BYTES).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from pallas_kernels.pallas_compat import LOG2E, dot_f32, interpret_mode, pl, plgpu

_P_BYTES = 2 << 30          # the largest P buffer one group of streams may use
_WORD = 32                  # tree tokens per bitmask word
_PV_PROGRAMS = 264          # P @ V programs wanted: about two waves of 132 SMs (H100 / H200)
_MIN_SPLIT_STEPS = 8        # fewest context steps (of pv_k keys) a P @ V split gets
_CHUNK = 64                 # Dk depth of one scores-GEMM step


def score_chunk(v_dim: int) -> int:
    """Dk depth of one scores-GEMM step; a rope part of this width rides in the same loop when
    the query holds it (rope_col == v_dim)."""
    return min(_CHUNK, v_dim)


@dataclasses.dataclass(frozen=True)
class TwoPassConfig:
    """Tiles and launch parameters of the two GEMMs (scores: m x n; P @ V: m x v, k deep)."""
    score_m: int = 128
    score_n: int = 256          # 128x256: the fastest score tile (docs/kernels/mla_attention.md)
    score_warps: int = 8
    score_stages: int = 3
    pv_m: int = 128
    pv_v: int = 256
    pv_k: int = 64
    pv_warps: int = 8
    pv_stages: int = 3

    @classmethod
    def parse(cls, text: str) -> "TwoPassConfig":
        """'tpMxNxWxS-MxVxKxWxS', e.g. 'tp128x128x8x3-128x256x64x8x3' (scores, then P @ V)."""
        score, _, pv = text.removeprefix("tp").partition("-")
        a, b = score.split("x"), pv.split("x")
        if len(a) != 4 or len(b) != 5 or not all(x.isdigit() for x in a + b):
            raise ValueError(f"two-pass config must read 'tpMxNxWxS-MxVxKxWxS'; got {text!r}")
        return cls(*map(int, a + b))

    @property
    def name(self) -> str:
        return (f"tp{self.score_m}x{self.score_n}x{self.score_warps}x{self.score_stages}-"
                f"{self.pv_m}x{self.pv_v}x{self.pv_k}x{self.pv_warps}x{self.pv_stages}")


def _scores_kernel(ctx_ref, q_ref, qr_ref, kv_ref, mask_ref, p_ref, m_ref, l_ref, *, scale, v_dim, rope,
                   rope_col, chunk, num_q, rows, block_m, block_n, kind):
    """One [block_m, block_n] tile of P, m, l. Program n of a launch of `kind`:
    "full": context tile n when it is whole (no masking at all);
    "edge": n = 0 the partial last context tile (if any), n >= 1 tree tile n - 1 (key bounds
    and the ancestor bitmask)."""
    n = pl.program_id(0)
    r0 = pl.program_id(1) * block_m
    ctx = ctx_ref[()]
    ctx_tiles = (ctx + block_n - 1) // block_n
    full_tiles = ctx // block_n
    col = jnp.arange(block_n)
    edge, t = kind == "edge", n - 1       # t: this program's tree tile (edge launch)
    if not edge:        # keys: slots n * block_n + col, all below ctx
        start, key_ok, tile, active = n * block_n, None, n, n < full_tiles
    else:                     # edge: the partial context tile (n = 0, keys below ctx) or tree tile t
        is_tree = n > 0       # (keys: tree tokens t * block_n + col at slots ctx + t * block_n + col)
        start = jnp.where(is_tree, ctx + t * block_n, full_tiles * block_n)
        key_ok = jnp.where(is_tree, t * block_n + col < num_q, full_tiles * block_n + col < ctx)
        tile = jnp.where(is_tree, ctx_tiles + t, full_tiles)
        active = is_tree | (full_tiles < ctx_tiles)

    @pl.when(active)
    def _():
        row_ok = r0 + jnp.arange(block_m) < rows
        keys, rws = pl.ds(start, block_n), pl.ds(r0, block_m)

        def load_keys(cols):
            if key_ok is None:        # a whole context tile: every key is in bounds and visible
                return plgpu.load(kv_ref.at[keys, cols])
            return plgpu.load(kv_ref.at[keys, cols], mask=key_ok[:, None], other=0)

        def body(i, acc):
            a = plgpu.load(q_ref.at[rws, pl.ds(i * chunk, chunk)], mask=row_ok[:, None], other=0)
            return acc + dot_f32(a, load_keys(pl.ds(i * chunk, chunk)), 1)

        acc = jnp.zeros((block_m, block_n), jnp.float32)
        if rope_col == v_dim and rope == chunk:     # q holds the rope part too: one loop over all of Dk
            s = jax.lax.fori_loop(0, v_dim // chunk + 1, body, acc) * scale
        else:
            acc = jax.lax.fori_loop(0, v_dim // chunk, body, acc)
            a = plgpu.load(qr_ref.at[rws, pl.ds(rope_col, rope)], mask=row_ok[:, None], other=0)
            s = (acc + dot_f32(a, load_keys(pl.ds(v_dim, rope)), 1)) * scale

        if edge:  # bit t * block_n + c of each row's ancestor mask: word t * block_n / 32 + c / 32
            bits = jnp.zeros((block_m, block_n), jnp.int32)
            for w in range(block_n // _WORD):
                word = plgpu.load(mask_ref.at[rws, jnp.maximum(t, 0) * (block_n // _WORD) + w],
                                  mask=row_ok, other=0)
                bit = (word[:, None] >> (col % _WORD)[None, :]) & 1
                bits = jnp.where((col // _WORD == w)[None, :], bit, bits)
            seen = (bits != 0) | (n == 0)      # edge program 0 is a context tile
            s = jnp.where(seen & key_ok[None, :], s, -jnp.inf)
        m = s.max(axis=1)     # -inf: the row sees no key of this tile (only in a tree tile)
        p = jnp.exp2(s - (jnp.where(m == -jnp.inf, 0.0, m) if edge else m)[:, None])
        plgpu.store(p_ref.at[rws, pl.ds(tile * block_n, block_n)], p.astype(p_ref.dtype), mask=row_ok[:, None])
        plgpu.store(m_ref.at[tile, rws], m, mask=row_ok)
        plgpu.store(l_ref.at[tile, rws], p.sum(axis=1), mask=row_ok)


def _pv_kernel(ctx_ref, p_ref, m_ref, l_ref, kv_ref, o_ref, *, num_q, rows, block_m, block_v, block_k, block_n,
               tree_tiles, v_blocks, splits):
    """Output columns c0 .. c0 + block_v of rows r0 .. r0 + block_m, over split `split` of the
    context steps (the last split also takes the tree steps); with splits > 1, o_ref holds this
    split's float32 partial sum (the factors are global, so partials simply add)."""
    c0 = pl.program_id(0) % v_blocks * block_v
    split = pl.program_id(0) // v_blocks
    r0 = pl.program_id(1) * block_m
    ctx = ctx_ref[()]
    ctx_tiles = (ctx + block_n - 1) // block_n
    row_ok = r0 + jnp.arange(block_m) < rows
    rws, kk = pl.ds(r0, block_m), jnp.arange(block_k)

    def row_stats(n, carry):
        """Online max and sum over the stream's tiles: (m_row, l_row) at the scale of m_row."""
        m_row, l_row = carry
        m = plgpu.load(m_ref.at[n, rws], mask=row_ok, other=-jnp.inf)
        l = plgpu.load(l_ref.at[n, rws], mask=row_ok, other=0)
        new = jnp.maximum(m_row, m)
        safe = jnp.where(new == -jnp.inf, 0.0, new)
        return new, l_row * jnp.exp2(m_row - safe) + l * jnp.exp2(m - safe)

    m_row, l_row = jax.lax.fori_loop(0, ctx_tiles + tree_tiles, row_stats,
                                     (jnp.full((block_m,), -jnp.inf, jnp.float32),
                                      jnp.zeros((block_m,), jnp.float32)))
    m_row = jnp.where(m_row == -jnp.inf, 0.0, m_row)
    inv_l = jnp.where(l_row > 0, 1.0 / jnp.where(l_row > 0, l_row, 1.0), 0.0)   # a row that sees nothing: 0

    def step(col0, start, key_ok, acc):
        """acc += (f * P[:, col0 : col0 + block_k]) @ V[start : start + block_k, c0 : c0 + block_v],
        f = exp(m_tile - m_row) / l_row the tile's softmax normaliser."""
        p = plgpu.load(p_ref.at[rws, pl.ds(col0, block_k)], mask=row_ok[:, None], other=0)
        m = plgpu.load(m_ref.at[col0 // block_n, rws], mask=row_ok, other=-jnp.inf)
        v = plgpu.load(kv_ref.at[pl.ds(start, block_k), pl.ds(c0, block_v)], mask=key_ok[:, None], other=0)
        f = jnp.exp2(m - m_row) * inv_l         # the tile's factor, applied to P in kv.dtype below
        return acc + dot_f32(p * f.astype(p.dtype)[:, None], v, 0)

    def ctx_body(i, acc):                       # P column = cache slot
        return step(i * block_k, i * block_k, i * block_k + kk < ctx, acc)

    tree0 = ctx_tiles * block_n                 # P column of tree token 0

    def tree_body(i, acc):                      # P column tree0 + t = tree token t, slot ctx + t
        return step(tree0 + i * block_k, ctx + i * block_k, i * block_k + kk < num_q, acc)

    ctx_steps = ctx_tiles * (block_n // block_k)
    per_split = (ctx_steps + splits - 1) // splits
    lo = jnp.minimum(split * per_split, ctx_steps)
    acc = jnp.zeros((block_m, block_v), jnp.float32)
    acc = jax.lax.fori_loop(lo, jnp.minimum(lo + per_split, ctx_steps), ctx_body, acc)
    tree_steps = -(-num_q // block_k)
    if splits > 1:    # only the last split; integer arithmetic (a bool where() lowers to an i1 bound)
        tree_steps = tree_steps * jnp.maximum(split - (splits - 2), 0)
    acc = jax.lax.fori_loop(0, tree_steps, tree_body, acc)
    col = split * v_blocks * block_v + c0 if splits > 1 else c0
    plgpu.store(o_ref.at[rws, pl.ds(col, block_v)], acc.astype(o_ref.dtype), mask=row_ok[:, None])


def _layout(num_slots: int, num_q: int, config: TwoPassConfig) -> tuple[int, int]:
    """(tree tiles, key tiles T) of P for N cache slots and Q tree tokens."""
    tree_tiles = -(-num_q // config.score_n)
    return tree_tiles, -(-(num_slots - num_q) // config.score_n) + tree_tiles


def scores(q_rows, qr_rows, kv, ctx_lens, row_mask, *, scale, v_dim, rope, rope_col, num_q, config,
           poison=False):
    """Pass 1: -> P [S, R, T * score_n] (kv.dtype), m and l [S, T, R] float32 (see the module doc):
    one launch over the whole context tiles, then one over the edge tiles (the partial context
    tile and the tree tiles) writing into the same buffers."""
    c = config
    num_s, rows, _ = q_rows.shape
    tree_tiles, tiles = _layout(kv.shape[1], num_q, c)
    out_shape = [jax.ShapeDtypeStruct((num_s, rows, tiles * c.score_n), kv.dtype),
                 jax.ShapeDtypeStruct((num_s, tiles, rows), jnp.float32),
                 jax.ShapeDtypeStruct((num_s, tiles, rows), jnp.float32)]
    args = [ctx_lens, q_rows, qr_rows, kv, row_mask]
    kernel = functools.partial(
        _scores_kernel, scale=scale * LOG2E, v_dim=v_dim, rope=rope, rope_col=rope_col, chunk=score_chunk(v_dim),
        num_q=num_q, rows=rows, block_m=c.score_m, block_n=c.score_n)
    into = [jnp.full(o.shape, jnp.nan, o.dtype) for o in out_shape] if poison else None
    row_blocks = -(-rows // c.score_m)
    outs = _call(functools.partial(kernel, kind="full"), (max(tiles - tree_tiles, 1), row_blocks, num_s), args,
                 out_shape, c.score_warps, c.score_stages, "mla_scores", into)
    return _call(functools.partial(kernel, kind="edge"), (tree_tiles + 1, row_blocks, num_s),
                 args, out_shape, c.score_warps, c.score_stages, "mla_edge_scores", list(outs))


def pv_splits(num_s: int, rows: int, v_dim: int, num_slots: int, num_q: int, config: TwoPassConfig) -> int:
    """Context splits of the P @ V pass: enough programs for about two waves of the GPU's SMs,
    each split at least _MIN_SPLIT_STEPS steps of context."""
    c = config
    programs = num_s * -(-rows // c.pv_m) * (v_dim // c.pv_v)
    steps = -(-(num_slots - num_q) // c.pv_k)
    return max(1, min(-(-_PV_PROGRAMS // programs), steps // _MIN_SPLIT_STEPS))


def pv(p, m, l, kv, ctx_lens, *, v_dim, num_q, config, out_dtype, poison=False):
    """Pass 2: P [S, R, T * score_n], m and l [S, T, R] -> out [S, R, v_dim] in out_dtype."""
    c = config
    num_s, rows, _ = p.shape
    v_blocks = v_dim // c.pv_v
    splits = pv_splits(num_s, rows, v_dim, kv.shape[1], num_q, c)
    kernel = functools.partial(_pv_kernel, num_q=num_q, rows=rows, block_m=c.pv_m, block_v=c.pv_v,
                               block_k=c.pv_k, block_n=c.score_n, tree_tiles=_layout(kv.shape[1], num_q, c)[0],
                               v_blocks=v_blocks, splits=splits)
    grid = (v_blocks * splits, -(-rows // c.pv_m), num_s)
    if splits == 1:
        out = jax.ShapeDtypeStruct((num_s, rows, v_dim), out_dtype)
    else:   # split k writes columns k * v_dim ..: float32 partials, summed below
        out = jax.ShapeDtypeStruct((num_s, rows, splits * v_dim), jnp.float32)
    (res,) = _call(kernel, grid, [ctx_lens, p, m, l, kv], [out], c.pv_warps, c.pv_stages, "mla_pv",
                   [jnp.full(out.shape, jnp.nan, out.dtype)] if poison else None)
    if splits > 1:
        res = res.reshape(num_s, rows, splits, v_dim).sum(axis=2).astype(out_dtype)
    return res


def _call(kernel, grid, args, out_shape, warps, stages, name, into=None):
    """pallas_call over grid (.., .., stream), each program seeing its stream's whole arrays (ctx_lens:
    its own entry). into: arrays the outputs are written into (aliased; what the kernel leaves
    alone keeps their values): earlier results, or NaN-filled buffers so unwritten parts show."""
    specs = lambda shapes: [pl.BlockSpec((None,) + x.shape[1:], lambda *g, n=x.ndim: (g[-1],) + (0,) * (n - 1))
                            for x in shapes]
    in_specs, out_specs = specs(args), specs(out_shape)
    aliases = {}
    if into is not None:
        n_in = len(args)
        aliases = {n_in + i: i for i in range(len(out_shape))}
        args, in_specs = args + list(into), in_specs + out_specs
        inner = kernel
        kernel = lambda *refs: inner(*refs[:n_in], *refs[n_in + len(out_shape):])
    return pl.pallas_call(
        kernel, grid=grid, in_specs=in_specs, out_specs=out_specs, out_shape=out_shape,
        input_output_aliases=aliases, interpret=interpret_mode(), name=name,
        compiler_params=plgpu.CompilerParams(num_warps=warps, num_stages=stages))(*args)


def fit_config(config: TwoPassConfig, v_dim: int) -> TwoPassConfig:
    """config with pv_v narrowed to v_dim (a narrow latent is one column block), checked."""
    c = dataclasses.replace(config, pv_v=min(config.pv_v, v_dim))
    for field in dataclasses.fields(c):
        val = getattr(c, field.name)
        if field.name.endswith(("_m", "_n", "_v", "_k")) and not (val > 0 and val & (val - 1) == 0):
            raise ValueError(f"TwoPassConfig.{field.name} must be a power of two; got {val}")
    if c.score_n < _WORD:
        raise ValueError(f"TwoPassConfig.score_n must be >= {_WORD} (whole bitmask words per tree tile); "
                         f"got {c.score_n}")
    if c.score_n % c.pv_k:
        raise ValueError(f"TwoPassConfig.pv_k={c.pv_k} must divide score_n={c.score_n}")
    if v_dim % c.pv_v:
        raise ValueError(f"TwoPassConfig.pv_v={c.pv_v} must divide v_dim={v_dim}")
    return c


def row_masks(node_mask, num_h: int, heads_first: bool, config: TwoPassConfig):
    """node_mask [S, Q, W] -> [S, R, Wp] int32: each (node, head) row's mask words (rows n * H + h,
    or h * Q + n when heads_first), padded to whole tree tiles of score_n / 32 words."""
    num_q = node_mask.shape[1]
    words = -(-num_q // config.score_n) * config.score_n // _WORD
    rows = jnp.tile(node_mask, (1, num_h, 1)) if heads_first else jnp.repeat(node_mask, num_h, axis=1)
    return jnp.pad(rows, ((0, 0), (0, 0), (0, words - rows.shape[2])))


def mla_attention_two_pass(q_rows, qr_rows, kv, ctx_lens, row_mask, *, scale: float, v_dim: int, rope: int,
                           rope_col: int, num_q: int, config: TwoPassConfig, poison: bool = False):
    """q_rows [S, R, .] (latent in columns [0, v_dim)), qr_rows [S, R, .] (rope in columns
    [rope_col, rope_col + rope)), kv [S, N, v_dim + rope], ctx_lens [S] int32, row_mask [S, R, Wp]
    int32 (Wp >= tree tiles x score_n / 32 words per row) -> [S, R, v_dim] in q_rows.dtype."""
    config = fit_config(config, v_dim)
    num_s, rows, _ = q_rows.shape
    tiles = _layout(kv.shape[1], num_q, config)[1]
    per_stream = rows * tiles * config.score_n * kv.dtype.itemsize
    group = max(1, min(num_s, _P_BYTES // per_stream))
    outs = []
    for s0 in range(0, num_s, group):
        sl = slice(s0, s0 + group)
        p, m, l = scores(q_rows[sl], qr_rows[sl], kv[sl], ctx_lens[sl], row_mask[sl], scale=scale, v_dim=v_dim,
                         rope=rope, rope_col=rope_col, num_q=num_q, config=config, poison=poison)
        outs.append(pv(p, m, l, kv[sl], ctx_lens[sl], v_dim=v_dim, num_q=num_q, config=config,
                       out_dtype=q_rows.dtype, poison=poison))
    return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=0)
