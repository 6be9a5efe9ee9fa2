"""MLA tree-verify attention with a warp-specialised Pallas Mosaic GPU kernel (Hopper only).

The kernel (`context_attention`) walks each stream's keys in 128-key pairs: first the whole
context pairs, then the tail pairs (the partial last pair of context and the Q tree tokens, at
most 127 + Q keys), whose scores it masks with per-row bit words (`tail_words`, from the ancestor
bitmask). `prepare` is the only XLA work before it: the query rows and the words (at plain decode
none: the kernel masks the tail by the context length and the node's own bit).

Layout: one CTA owns 64 query rows of one stream (one tree node's 64 heads at Kimi-K2 width) and
walks the keys in 64-key tiles; the latent tile serves as K (all Dk channels) and as V (its first
v_dim). Three warpgroups:
- a producer streams the key tiles by TMA into a two-slot ring (Q plus two 576-wide tiles fill
  shared memory);
- two consumers each own half of the [64, v_dim] float32 output accumulator (64 x 256 at K2) and
  score the tiles in turn (consumer 0 the even tiles, consumer 1 the odd): while one runs its
  softmax, the other's matrix products keep the tensor cores busy. The consumer that scored a
  tile writes its probabilities P (bf16) and new row max to shared memory; the other rescales
  its half to that max and multiplies the same P by its half of V. At the end each consumer
  stages its normalised half of O in the shared memory Q held and writes it by TMA.
CTAs of consecutive row blocks of one stream run as a cluster (`cluster_size`) whose key slots
refill only when every CTA has consumed them, so they read each key tile from L2 at about the
same time.

Splits: with too few row blocks to fill the GPU (one stream with a small tree, plain decode), or
just more than a whole number of waves, the streams' pairs are split into runs, one CTA each
(flash-decoding; the count from `split_count`'s wave model), whose parts one Pallas:Triton kernel
(`merge.merge_splits`) or XLA's `combine_splits` merges. Past one wave each run's row blocks are
launched together, so that they read its keys from L2.

Balance (for ragged contexts): the CTAs go to the streams in proportion to their pairs
(`runs.run_schedule`), so ragged contexts cost about what equal ones of the same total do;
unsplit calls launch the longest streams' CTAs first (`runs.stream_order`), or where their CTAs
fit one wave split each stream in two (`launch`), launched longest run first (`runs.part_order`).
It costs a little at equal contexts, so the op's default is off and the model's on
(`forward(attn_balance=True)`).

impl="auto" takes this kernel on a Hopper GPU for caches of AUTO_MIN_SLOTS or more, or for
AUTO_MIN_CTAS row blocks or more (`choose`). Off a Hopper GPU the registered function refuses
(`supports`): jax's Mosaic GPU interpreter lacks run_state, the GPU load and layout_cast, wgmma
with a register or transposed operand and cluster barriers, so `context_attention_xla` stands in
for the kernel in the CPU tests of the rest. Measurements and the variants not taken:
docs/kernels/mla_attention.md.
"""

from __future__ import annotations

import functools
import inspect
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from pallas_kernels import registry
from pallas_kernels.mla_attention.merge import merge_splits
from pallas_kernels.mla_attention.runs import (BLOCK_K, PAIR, load_schedule, part_order, part_runs, pick,
                                               run_bounds, run_of, stream_order, tail_counts, total_pairs)

BLOCK_Q = 64        # query rows per CTA: one warpgroup's wgmma M
ROW_ALIGN = 8       # query rows a multiple of this (TMA's (8, 64) tiles; the merge's 8-row programs)
_SMEM = 232448      # bytes of shared memory a Hopper CTA may use
EPILOGUES = ("tma", "registers")   # how the consumers write O (context_attention(epilogue=))
PROFILE_RANGES = 16  # phase entries the profiler may record per warpgroup (context_attention(profile_dir=))
# context_attention(timeline=True)'s columns per CTA: %globaltimer's low word (ns) when consumer 0
# starts, has Q, leaves its loops, has both row sums, has issued O's stores, ends; when consumer 1
# leaves its loops; when the producer has issued its last load; and the CTA's SM (%smid).
TIMELINE = ("start", "q_ready", "loops_done", "sums_done", "stores_issued", "end", "loops_done_1",
            "last_load", "smid")


def supported(dk: int, v_dim: int, dtype) -> str | None:
    """Why the kernel cannot take these dims and dtype, or None when it can."""
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"dtype must be bfloat16 or float16; got {jnp.dtype(dtype)}"
    if dk % 64 or v_dim % 128 or v_dim > dk:
        return f"needs Dk % 64 == 0 and v_dim % 128 == 0, v_dim <= Dk; got Dk={dk}, v_dim={v_dim}"
    if 3 * BLOCK_Q * dk * 2 + BLOCK_Q * BLOCK_K * 2 + 3 * BLOCK_Q * 4 + 1024 > _SMEM:
        return f"Dk={dk} is too wide: Q and two key tiles of {BLOCK_K} keys exceed shared memory"
    return None


def context_attention(q, kv, ctx_lens, tail_bits, *, num_q: int, scale: float, v_dim: int, cluster: int = 1,
                      splits: int = 1, balance: bool = False, profile_dir: str = "", epilogue: str = "tma",
                      timeline: bool = False):
    """q [S, R, Dk], kv [S, N, Dk] (bf16 or f16), ctx_lens [S] int32 (>= 0), tail_bits [S, W, R64]
    int32 -> (O [S, R, v_dim] in q.dtype, lse2 [S, R64] float32), R64 = ceil(R / 64) * 64.

    With pairs = ctx_lens // 128 and tail_tiles = ceil((ctx_lens % 128 + num_q) / 64)
    (`tail_counts`, derived in the kernel), row r of stream s attends to every key below
    128 * pairs[s], and to tail key 128 * pairs[s] + t (t < 64 * tail_tiles[s]) where bit t % 32
    of tail_bits[s, t // 32, r] is set. O is normalised by the row sum; lse2 = log2 of the sum of
    exp2(scale * log2(e) * q.k) (-inf, and O = 0, where a row sees no key).

    Rows: R a multiple of ROW_ALIGN (8) whose ceil(R / 64) row blocks make whole clusters. The
    last block may be partial: the tensor TMA of Q and O reads zeros for its missing rows and
    clips their stores (the "registers" epilogue needs R % 64 == 0). tail_bits is zero past R;
    lse2 past R belongs to no row (its [64] row slice is stored by a plain bulk copy, clipped only
    at the end of the whole array, so an [S, R] lse2 would take a partial block's extra rows into
    the next stream's first).

    Tail: W >= 4 * ceil(max(tail_tiles) / 2); set bits name keys below N only (the tail's last
    tile may reach past N: TMA reads zeros there). Keys the bits leave out must still hold finite
    values (the kernel multiplies them by probability 0). The tail walks ceil(tail_tiles / 2)
    pairs; with tail_tiles odd its last pair is half a pair (one tile: the second is neither loaded
    nor multiplied), which the run holding it takes before its other pairs. The decode form
    (num_q 1): tail_bits [S] int32, the node's mask word, whose bit 0 says whether the node sees
    its own key (tail key ctx_lens % 128); every row sees the context, and the kernel makes the
    mask itself from the stream's context length, so a decode call has no XLA kernel before it.

    splits > 1 (flash-decoding, for shapes with too few row blocks to fill the GPU) gives each row
    block W = S * splits CTAs, each running one run of one stream, by `run_bounds` (the remainder
    to the last runs, which hold the tail): without balance CTA f = s * splits + k is run k of
    stream s; with balance the CTAs are shared out among the streams in proportion to the pairs
    each walks (`runs.run_schedule` and `runs.run_of`; splits runs each when the contexts are
    equal). Past one wave (R / 64 * W > FILL_CTAS) each run's row blocks are launched together, so
    that they read its keys from L2. It returns each run's part: (O [W, R, v_dim] in q.dtype,
    lse2 [W, R64] float32), part f for CTA f's run (a run of no pairs, where a stream has fewer
    pairs than runs, gives O = 0, lse2 = -inf). `combine_splits` or `merge.merge_splits` merges
    the parts (bf16 parts halve the bytes the kernel writes and the merge reads; the merge's
    weights come from the float32 lse).

    balance also orders the launch, so that with ragged contexts the long streams' CTAs are not
    the last wave's: with splits 1 and S > 1 the CTAs go longest stream first (`runs.stream_order`,
    one XLA sort before the kernel; grid position s_grid runs stream order[s_grid], all its row
    blocks together), and split calls whose CTAs exceed one wave (R / 64 * S * splits >
    FILL_CTAS) go by their runs' pairs, most first (`runs.part_order`; grid position g runs CTA
    part order[g] of every row block). Every CTA then reads every stream's context before its
    first load, a small cost at equal contexts; the op's default is off.

    epilogue: "tma" stages O in Q's shared memory and writes it by TMA; "registers" stores it
    from the accumulator's registers (the slower form, for A/B runs of mla_kernel_bench.py).
    profile_dir: Mosaic GPU's in-kernel profiler records every warpgroup's phases (consumers:
    wait_q, context, tail, epilogue with its sums, store and lse; producer: loads) and writes a
    Chrome trace per compiled call there (experiments/mla_kernel_bench.py --profile reads it).
    timeline: a third output, int32 [S, R / 64, splits, len(TIMELINE)] (CTA f = s * splits + k
    at [s, :, k] whatever the launch order; unsplit with balance, stream order[s] at [s]): when each
    CTA passed the points TIMELINE names, read from %globaltimer by plain stores (no profiler
    buffer, no extra synchronisation: experiments/mla_kernel_bench.py --timeline)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plmg

    num_s, rows, dk = q.shape
    half = v_dim // 2
    blocks = -(-rows // BLOCK_Q)            # the last may be partial: TMA reads zeros past R, clips stores
    if why := supported(dk, v_dim, q.dtype):
        raise ValueError(f"context_attention: {why}")
    if rows % ROW_ALIGN or blocks % cluster:
        raise ValueError(f"context_attention: rows={rows} must be a multiple of {ROW_ALIGN} in a whole number "
                         f"of clusters of {cluster} {BLOCK_Q}-row blocks")
    if splits < 1:
        raise ValueError(f"context_attention: splits must be >= 1; got {splits}")
    if epilogue not in EPILOGUES:
        raise ValueError(f"context_attention: epilogue must be one of {EPILOGUES}; got {epilogue!r}")
    if epilogue == "registers" and rows % BLOCK_Q:
        raise ValueError(f"context_attention: the registers epilogue needs rows={rows} a multiple of {BLOCK_Q} "
                         f"(its stores are not clipped)")
    decode = tail_bits.ndim == 1        # the decode form: one word per stream, the mask made in the kernel
    if decode and (num_q != 1 or tail_bits.shape != (num_s,)):
        raise ValueError(f"context_attention: tail_bits of one word per stream (the decode form) must be [S={num_s}] "
                         f"with num_q=1; got {tail_bits.shape} with num_q={num_q}")
    if not decode and (tail_bits.ndim != 3 or tail_bits.shape[0] != num_s or tail_bits.shape[2] != blocks * BLOCK_Q
                       or tail_bits.shape[1] % 4):
        raise ValueError(f"context_attention: tail_bits must be [S={num_s}, 4k, {blocks * BLOCK_Q}] int32 (R={rows} "
                         f"rounded up to {BLOCK_Q}), or [S] with num_q=1; got {tail_bits.shape}")
    c = scale * math.log2(math.e)           # scores in log2 units: every exponential is an exp2
    row_layout = plmg.Layout.WGMMA.reduce(1)
    # plmg.load of an indexed ref: jax 0.10 requires an index argument, jax 0.11 deprecates it
    index_required = inspect.signature(plmg.load).parameters["idx"].default is inspect.Parameter.empty
    load = (lambda ref, **kw: plmg.load(ref, (), **kw)) if index_required else plmg.load

    longest_first = balance and splits == 1 and num_s > 1
    parts_first = balance and splits > 1 and blocks * num_s * splits > FILL_CTAS

    def body(q_ref, kv_ref, ctx_ref, bits_ref, *refs, q_space, k_smem, p_smem, stat_smem, slot_smem, q_bar,
             k_full, k_free, p_ready, l_bar, done=None):
        order_ref, refs = (refs[0], refs[1:]) if longest_first or parts_first else (None, refs)
        o_ref, lse_ref, times_ref = (*refs, None)[:3]
        q_smem, o_stage = q_space     # O is staged where Q was, once both consumers are done with Q
        # stat_smem rows (shared memory is full to the last KB): 0 and 1 the latest row max of
        # consumer 0 and 1; at the end row 1 consumer 0's row sum, row 2 consumer 1's, then lse.
        if parts_first:     # grid position g runs CTA part order[g] of every row block
            part = order_ref[lax.axis_index("part")]
            s_grid, split = lax.div(part, splits), lax.rem(part, splits)
        else:
            s_grid = lax.axis_index("stream")
            split = lax.axis_index("split") if splits > 1 else 0
            part = s_grid * splits + split
        block = lax.axis_index("rows")
        if cluster > 1:     # the CTAs of a cluster: consecutive row blocks of one stream
            block = block * cluster + lax.axis_index("cluster")
        r0 = block * BLOCK_Q
        rows_here = pl.ds(r0, BLOCK_Q)
        wg = lax.axis_index("wg")
        if splits > 1 and balance:      # CTA `part` of its row block: run k of stream s (runs.py)
            lens = [ctx_ref[j] for j in range(num_s)]
            totals = [total_pairs(n, num_q) for n in lens]
            s, run_index, count = run_of(part, totals, num_s * splits)
            ctx_len, total = pick(lens, s), pick(totals, s)
            first, num_pairs = run_bounds(total, count, run_index)
            # Opaque to LLVM: else it sinks the schedule's sums into each warpgroup's branch, and
            # the S totals they need stay live through the consumers' loop, where ptxas spills.
            s, ctx_len, total, first, num_pairs = lax.optimization_barrier((s, ctx_len, total, first, num_pairs))
        elif splits > 1:
            s, ctx_len = s_grid, ctx_ref[s_grid]
            total = total_pairs(ctx_len, num_q)
            first, num_pairs = run_bounds(total, splits, split)
        else:       # longest_first: grid position s_grid runs the stream of that rank
            s = order_ref[s_grid] if longest_first else s_grid
            ctx_len = ctx_ref[s]
            total = total_pairs(ctx_len, num_q)
            first, num_pairs = 0, total
        ctx_pairs, tail_tiles = tail_counts(ctx_len, num_q)
        if decode:      # the tail keys below tail_seen: the rest of the context, then the node if its bit is set
            tail_seen = ctx_len - PAIR * ctx_pairs + (bits_ref[s] & 1)
        odd = lax.rem(tail_tiles, 2)
        # The run's whole-context pairs, then its tail pairs (keys under the mask). When the tail
        # has an odd number of tiles, the run that ends the stream also has half a pair, the tail's
        # last tile, which it takes first, from slot 1 (`runs.load_schedule`).
        plain = jnp.maximum(jnp.minimum(ctx_pairs - first, num_pairs), 0)
        half_tail = jnp.where((first + num_pairs == total) & (num_pairs > 0), odd, 0)
        masked = num_pairs - plain - half_tail         # the run's whole tail pairs
        tail_first = first + plain - ctx_pairs    # the run's first tail pair, counted from the tail's start
        num_tiles = 2 * num_pairs - half_tail

        def stamp(point: str):
            if timeline:
                _stamp(times_ref.at[s_grid, block, split], TIMELINE.index(point))

        def tile_keys(tile):
            return kv_ref.at[s, pl.ds((2 * first + tile) * BLOCK_K, BLOCK_K)]

        @pl.when(wg == 2)
        def _producer():
            plmg.set_max_registers(40, action="decrease")
            plmg.copy_gmem_to_smem(q_ref.at[s, pl.ds(r0, BLOCK_Q)], q_smem.at[0], q_bar)

            def load(j):
                tile, slot = load_schedule(j, num_tiles, half_tail)
                plmg.barrier_wait(k_free.at[slot])
                plmg.copy_gmem_to_smem(tile_keys(tile), k_smem.at[slot], k_full.at[slot])

            def prefetch(j):
                tile, slot = load_schedule(j, num_tiles, half_tail)
                plmg.copy_gmem_to_smem(tile_keys(tile), k_smem.at[slot], k_full.at[slot])

            with jax.named_scope("loads"):
                for j in range(2):
                    pl.when(num_tiles > j)(functools.partial(prefetch, j))
                pl.loop(2, num_tiles)(load)
            stamp("last_load")

        def consumer(w: int):
            """Consumer w: scores tiles 2i + w (slot w), owns output columns [w, w + 1) * half."""
            other = 1 - w
            cols = pl.ds(w * half, half)
            plmg.set_max_registers(232, action="increase")
            slot_smem[w] = jnp.int32(w)
            if w == 0:
                stamp("start")
                stamp("smid")
            with jax.named_scope("wait_q"):
                plmg.barrier_wait(q_bar)
            if w == 0:
                stamp("q_ready")

            def scores(mine, slot, bar: int):
                """Q K^T over the tile in key slot `slot` (its barriers: index bar)."""
                plmg.barrier_wait(k_full.at[bar])

                def run(s_ref):
                    plmg.wgmma(s_ref, q_smem.at[mine - w], k_smem.at[slot].transpose((1, 0)))
                    return s_ref[...]
                return pl.run_scoped(run, plmg.ACC((BLOCK_Q, BLOCK_K), jnp.float32))

            def pv(acc, p, slot, barrier_slot):
                """acc + p @ (this consumer's half of V in key slot `slot`), then free the slot."""
                def run(acc_ref):
                    plmg.wgmma(acc_ref, p, k_smem.at[slot, :, cols])
                acc = pl.run_state(run)(plmg.ACC.init(acc))
                plmg.barrier_arrive(k_free.at[barrier_slot])
                return acc

            def rescale(acc, l, m, m_ref):
                alpha = jnp.exp2(m - m_ref)
                return acc * lax.broadcast_in_dim(alpha, acc.shape, [0]), l * alpha

            def finite(m):
                """The row max as a reference point: 0 where a row has seen no key yet (-inf),
                so that exp2(-inf - reference) is 0, not NaN (only the tail's tiles can
                leave every key of a row out)."""
                return jnp.where(m == -jnp.inf, 0.0, m)

            def take_other(acc, m, l, mine, tail: bool, slot, bar: int):
                """Fold in the other consumer's latest tile (in key slot `slot`, barriers bar):
                its P and row max from shared memory."""
                plmg.barrier_wait(p_ready.at[other])
                m_new = load(stat_smem.at[other], layout=row_layout)
                acc, l = rescale(acc, l, m, finite(m_new) if tail else m_new)
                plmg.barrier_wait(k_full.at[bar])
                return pv(acc, p_smem.at[mine - w], slot, bar), m_new, l

            def own_tile(acc, m, l, sc, mine, tail: bool, slot, bar: int):
                """Softmax of this consumer's scores sc (log2 units) of the tile in key slot
                `slot`; publish P and the row max; P @ V half."""
                m_new = jnp.maximum(m, sc.max(axis=1))
                m_ref = finite(m_new) if tail else m_new
                acc, l = rescale(acc, l, m, m_ref)
                p = jnp.exp2(sc - lax.broadcast_in_dim(m_ref, sc.shape, [0]))
                l = l + p.sum(axis=1)
                p16 = p.astype(p_smem.dtype)
                p_smem[0] = p16
                stat_smem[w] = m_new
                plmg.commit_smem()
                plmg.barrier_arrive(p_ready.at[w])
                return pv(acc, p16, slot, bar), m_new, l

            def tail_mask(sc, i):
                """sc with -inf at the keys this consumer's i-th tail tile leaves out: tile
                2 (tail_first + i) + w of the tail, its keys' bits in two words per row (the
                decode form: the tile's keys from tail_seen on)."""
                col = plmg.layout_cast(lax.broadcasted_iota(jnp.int32, sc.shape, 1), plmg.Layout.WGMMA)
                if decode:
                    return jnp.where(col < tail_seen - (2 * (tail_first + i) + w) * BLOCK_K, sc, -jnp.inf)
                word = 4 * (tail_first + i) + 2 * w
                lo, hi = (lax.broadcast_in_dim(load(bits_ref.at[s, word + k, rows_here], layout=row_layout,
                                                         optimized=False), sc.shape, [0]) for k in (0, 1))
                bits = lax.shift_right_logical(jnp.where(col < 32, lo, hi), col & 31)
                return jnp.where((bits & 1) != 0, sc, -jnp.inf)

            def step(tail: bool, half_pair: bool = False):
                """One pair of tiles (half_pair: one tile in slot 1, scored by consumer 0, which
                then waits until consumer 1 has taken it: the next pair's P and row max go to
                the same shared memory)."""
                def run(i, carry):
                    # Consumer 0 scores tile 2i, then folds in tile 2i + 1; consumer 1 scores
                    # tile 2i + 1 while consumer 0 runs its softmax, then folds in tile 2i (the
                    # fastest order: docs/kernels/mla_attention.md).
                    acc, m, l = carry
                    # `mine` is w, read back from shared memory every step: the operand
                    # addresses of the matrix products then depend on a value the compilers
                    # cannot see through, so they are formed next to each product instead of
                    # being hoisted out of the loop (some 80 64-bit descriptors, more than the
                    # registers left beside the accumulator, which ptxas would spill).
                    mine = slot_smem[w]
                    if half_pair:       # slot 1: 1 - mine for consumer 0, mine for consumer 1
                        if w == 1:
                            carry = take_other(acc, m, l, mine, tail, mine, 1)
                            plmg.barrier_arrive(p_ready.at[1])
                            return carry
                        sc = tail_mask(scores(mine, 1 - mine, 1) * c, i)
                        carry = own_tile(acc, m, l, sc, mine, tail, 1 - mine, 1)
                        plmg.barrier_wait(p_ready.at[1])
                        return carry
                    own, theirs = (mine, w), (1 - mine, other)      # (slot, barrier index)
                    sc = scores(mine, *own) * c
                    if tail:
                        sc = tail_mask(sc, i)
                    if w == 0:
                        return take_other(*own_tile(acc, m, l, sc, mine, tail, *own), mine, tail, *theirs)
                    return own_tile(*take_other(acc, m, l, mine, tail, *theirs), sc, mine, tail, *own)
                return run

            def finish(acc, m, l):
                """The two consumers' row sums added; O normalised and written; lse (consumer 0)."""
                # Row 1 (consumer 1's row max) is free once consumer 0 has taken consumer 1's
                # last tile; consumer 1 has read row 0 (consumer 0's) by then.
                own_row, their_row = (1, 2) if w == 0 else (2, 1)
                with jax.named_scope("sums"):
                    stat_smem[own_row] = l
                    plmg.commit_smem()
                    plmg.barrier_arrive(l_bar)
                    plmg.barrier_wait(l_bar)
                    l_tot = l + load(stat_smem.at[their_row], layout=row_layout)
                if w == 0:
                    stamp("sums_done")
                # Normalise and write O 64 columns at a time; a row that saw no key gives zeros and
                # lse -inf (its row max -inf, its row sum 0).
                inv = lax.broadcast_in_dim(1.0 / jnp.where(l_tot > 0, l_tot, 1.0), (BLOCK_Q, 64), [0])
                with jax.named_scope("store"):
                    for j in range(half // 64):
                        out_cols = pl.ds(w * half + j * 64, 64)
                        out_at = (o_ref.at[s, rows_here, out_cols] if splits == 1
                                  else o_ref.at[part, rows_here, out_cols])
                        o_j = (acc[:, j * 64:(j + 1) * 64] * inv).astype(o_ref.dtype)
                        if epilogue == "registers":
                            out_at[...] = o_j
                        else:    # past l_bar neither consumer reads Q again: its space holds O
                            o_stage.at[w, j][...] = o_j
                            plmg.commit_smem()
                            plmg.copy_smem_to_gmem(o_stage.at[w, j], out_at)
                if w == 0:
                    stamp("stores_issued")
                if w == 0:       # row 2: consumer 1's row sum, read only by consumer 0 (above)
                    with jax.named_scope("lse"):
                        stat_smem[2] = m + jnp.log2(l_tot)
                        plmg.commit_smem()
                        lse_at = lse_ref.at[s, rows_here] if splits == 1 else lse_ref.at[part, rows_here]
                        plmg.copy_smem_to_gmem(stat_smem.at[2], lse_at)
                if w == 0 or epilogue == "tma":     # shared memory must outlive the TMA stores' reads
                    plmg.wait_smem_to_gmem(0, wait_read_only=True)
                if cluster > 1:   # no CTA may exit while another can still arrive on its barriers
                    plmg.barrier_arrive(done)
                    plmg.barrier_wait(done)
                if w == 0:
                    stamp("end")

            m0 = plmg.layout_cast(jnp.full((BLOCK_Q,), -jnp.inf, jnp.float32), row_layout)
            l0 = plmg.layout_cast(jnp.full((BLOCK_Q,), 0.0, jnp.float32), row_layout)
            acc0 = plmg.layout_cast(jnp.full((BLOCK_Q, half), 0.0, jnp.float32), plmg.Layout.WGMMA)
            # Named scopes: the phases Mosaic GPU's profiler records (context_attention(profile_dir=)).
            # Half a pair first: last, the run would end on one consumer's softmax with no load in
            # flight; first, that softmax overlaps the loads of the first pair.
            with jax.named_scope("half_pair"):
                carry = lax.fori_loop(masked, masked + half_tail, step(True, half_pair=True), (acc0, m0, l0))
            with jax.named_scope("context"):
                carry = lax.fori_loop(0, plain, step(False), carry)
            with jax.named_scope("tail"):
                acc, m, l = lax.fori_loop(0, masked, step(True), carry)
            stamp("loops_done" if w == 0 else "loops_done_1")
            with jax.named_scope("epilogue"):
                finish(acc, m, l)

        pl.when(wg == 0)(lambda: consumer(0))
        pl.when(wg == 1)(lambda: consumer(1))

    tiled = (plmg.TilingTransform((8, 64)), plmg.SwizzleTransform(128))
    if cluster > 1:
        k_free = plmg.ClusterBarrier(collective_axes=("cluster",), num_arrivals=2, num_barriers=2)
    else:
        k_free = plmg.Barrier(num_arrivals=2, num_barriers=2)
    scratch = dict(
        q_space=plmg.RefUnion(plmg.SMEM((1, BLOCK_Q, dk), q.dtype, transforms=tiled),
                              plmg.SMEM((2, half // 64, BLOCK_Q, 64), q.dtype, transforms=tiled)),
        k_smem=plmg.SMEM((2, BLOCK_K, dk), kv.dtype, transforms=tiled),
        p_smem=plmg.SMEM((1, BLOCK_Q, BLOCK_K), kv.dtype, transforms=tiled),
        stat_smem=plmg.SMEM((3, BLOCK_Q), jnp.float32),
        slot_smem=plmg.SMEM((2,), jnp.int32),
        q_bar=plmg.Barrier(),
        k_full=plmg.Barrier(num_barriers=2),
        k_free=k_free,
        p_ready=plmg.Barrier(num_arrivals=1, num_barriers=2),
        l_bar=plmg.Barrier(num_arrivals=2),
    )
    mesh = {}
    if cluster > 1:
        scratch["done"] = plmg.ClusterBarrier(collective_axes=("cluster",), num_arrivals=2)
        mesh = dict(cluster=(cluster,), cluster_names=("cluster",))
    if splits == 1:
        out_type = (jax.ShapeDtypeStruct((num_s, rows, v_dim), q.dtype),
                    jax.ShapeDtypeStruct((num_s, blocks * BLOCK_Q), jnp.float32))
        # Mosaic GPU launches the last grid axis fastest: every stream's row block 0 first, or
        # (longest_first) all row blocks of the longest stream first.
        grid, grid_names = (blocks // cluster, num_s), ("rows", "stream")
        if longest_first:
            grid, grid_names = grid[::-1], grid_names[::-1]
    else:
        out_type = (jax.ShapeDtypeStruct((num_s * splits, rows, v_dim), q.dtype),
                    jax.ShapeDtypeStruct((num_s * splits, blocks * BLOCK_Q), jnp.float32))
        # Within one wave every part's row blocks run together; past one, each part's row blocks
        # are launched together (the rows axis last), so that a wave reads few runs' keys, each
        # from L2 for all its row blocks: by their runs' pairs, most first, with balance.
        grid, grid_names = (blocks // cluster, num_s, splits), ("rows", "stream", "split")
        if parts_first:
            grid, grid_names = (num_s * splits, blocks // cluster), ("part", "rows")
        elif blocks * num_s * splits > FILL_CTAS:
            grid, grid_names = (num_s, splits, blocks // cluster), ("stream", "split", "rows")
    if timeline:
        out_type += (jax.ShapeDtypeStruct((num_s, blocks, splits, len(TIMELINE)), jnp.int32),)
    kernel = plmg.kernel(
        body,
        out_type=out_type,
        grid=grid, grid_names=grid_names, **mesh,
        num_threads=3, thread_name="wg", scratch_types=scratch,
        # The WGMMA layout's row reductions stay within a warp: no reduction scratch, which
        # would not fit beside Q and two 576-wide key tiles.
        compiler_params=plmg.CompilerParams(
            approx_math=True, reduction_scratch_bytes=0,
            **(dict(profile_space=PROFILE_RANGES, profile_dir=profile_dir) if profile_dir else {})),
    )
    order = ([stream_order(ctx_lens, num_q)] if longest_first
             else [part_order(ctx_lens, num_q, num_s * splits)] if parts_first else [])
    return kernel(q, kv, ctx_lens.astype(jnp.int32), tail_bits.astype(jnp.int32), *order)


def _stamp(ref, column: int):
    """ref[column] = %globaltimer's low word (ns; %smid for column "smid"), an int32 store to
    global memory from every thread that runs it (they race to write about the same value)."""
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import memref
    from jax.experimental.mosaic.gpu import utils as mgpu_utils
    from jax.experimental.pallas import mosaic_gpu as plmg

    @plmg.inline_mgpu(arg_types=(plmg.RefType(),))
    def store(_, gmem):
        value = mgpu_utils.smid() if TIMELINE[column] == "smid" else mgpu_utils.globaltimer("low")
        memref.store(value, gmem, [mgpu_utils.c(column, ir.IndexType.get())])
    store(ref)


def context_attention_xla(q, kv, ctx_lens, tail_bits, *, num_q: int, scale: float, v_dim: int, cluster: int = 1,
                          splits: int = 1, balance: bool = False):
    """Pure-JAX twin of `context_attention` (same contract), for the CPU tests of the parts
    around the kernel."""
    del cluster
    num_s, rows = q.shape[:2]
    if tail_bits.ndim == 1:     # the decode form: the node's mask word, for every row
        tail_bits = decode_words(ctx_lens, tail_bits, rows)
    tail_bits = tail_bits[..., :rows]           # the kernel's rows rounded up to 64: the real ones
    pairs, tail_tiles = tail_counts(ctx_lens.astype(jnp.int32), num_q)
    c = scale * math.log2(math.e)
    keys = jnp.arange(kv.shape[1])
    start = PAIR * pairs[:, None]                                                  # [S, 1]
    t = jnp.clip(keys[None, :] - start, 0, 32 * tail_bits.shape[1] - 1)            # [S, N]
    words = jnp.take_along_axis(tail_bits, (t // 32)[:, :, None], axis=1)          # [S, N, R]
    in_tail = (keys[None, :] >= start) & (keys[None, :] < start + BLOCK_K * tail_tiles[:, None])
    bit = (lax.shift_right_logical(words, (t % 32)[:, :, None]) & 1) == 1
    seen = ((keys[None, :] < start)[..., None] | (in_tail[..., None] & bit)).swapaxes(1, 2)   # [S, R, N]
    st = jnp.einsum("srd,snd->srn", q, kv, preferred_element_type=jnp.float32) * c
    vals = kv[..., :v_dim].astype(jnp.float32)
    if splits == 1:
        stream, first, count = jnp.arange(num_s), jnp.zeros(num_s, jnp.int32), pairs + (tail_tiles + 1) // 2
    else:
        stream, first, count = part_runs(ctx_lens, num_q, num_s * splits, balance)
    run = (keys[None, :] >= (PAIR * first)[:, None]) & (keys[None, :] < (PAIR * (first + count))[:, None])   # [P, N]
    sk = jnp.where(seen[stream] & run[:, None, :], st[stream], -jnp.inf)                                # [P, R, N]
    m = sk.max(axis=-1)
    p = jnp.exp2(sk - jnp.where(jnp.isfinite(m), m, 0.0)[..., None])
    l = p.sum(axis=-1)
    o = jnp.einsum("prn,pnv->prv", p, vals[stream]) / jnp.where(l > 0, l, 1.0)[..., None]
    lse = m + jnp.log2(l)
    return o.astype(q.dtype), jnp.pad(lse, ((0, 0), (0, -rows % BLOCK_Q)), constant_values=-jnp.inf)


def combine_splits(o, lse, ctx_lens, *, num_q: int, balance: bool = False):
    """The parts of `context_attention(..., splits > 1, balance)` for contexts ctx_lens [S] and
    num_q tree tokens, O [W, R, v] (any float dtype) and lse2 [W, >= R] float32 (its first R
    rows taken), merged per stream
    (its parts by `runs.part_runs`) by their log-sum-exp in float32 -> O [S, R, v] float32 (zeros
    where no part saw a key)."""
    num_s = ctx_lens.shape[0]
    lse = lse[:, :o.shape[1]]
    stream, _, _ = part_runs(ctx_lens, num_q, o.shape[0], balance)
    member = stream[None, :] == jnp.arange(num_s)[:, None]                              # [S, W]
    lse_s = jnp.where(member[:, :, None], lse[None], -jnp.inf)                          # [S, W, R]
    top = lse_s.max(axis=1)
    w = jnp.exp2(lse_s - jnp.where(jnp.isfinite(top), top, 0.0)[:, None])               # 0 for others' parts
    den = w.sum(axis=1)
    out = jnp.einsum("swr,wrv->srv", w, o.astype(jnp.float32))
    return out / jnp.where(den > 0, den, 1.0)[..., None]


def cluster_size(rows: int) -> int:
    """CTAs per cluster: two when the ceil(rows / 64) row blocks pair up, else one. A pair shares
    each key tile through L2; larger clusters of full-SM CTAs co-reside worse on the GPCs
    (docs/kernels/mla_attention.md)."""
    return 2 if -(-rows // BLOCK_Q) % 2 == 0 else 1


FILL_CTAS = 132     # SMs of an H100 / H200 SXM; at K2's width (Dk 576) one CTA fills an SM's shared memory
MIN_SPLIT_PAIRS = 1  # pairs (128 keys) per run at least
# The wave model split_count weighs run counts by (fit to kernel and merge device times at K2
# width on the H200: docs/kernels/mla_attention.md): a CTA costs CTA_US + PAIR_US per pair of its
# run (one CTA per SM, so the CTAs run in waves of FILL_CTAS), the merge MERGE_US + its parts'
# bytes at MERGE_BYTES_PER_US.
CTA_US, PAIR_US = 3.3, 3.45
MERGE_US, MERGE_BYTES_PER_US = 3.0, 3.0e6
PART_ROW_BYTES = 512 * 2    # a part's row: v 512 in bf16
WAVE_GAIN = 0.9             # leave the one-wave rule only for an estimate at least 10% lower
WAVE_TIE = 1.03             # ... for the fewest runs estimated within 3% of the lowest (the model's error)


def split_estimate_us(ctas: int, pairs: int, splits: int) -> float:
    """split_count's wave model: the estimated device us of a call of `ctas` row-block CTAs over
    `pairs` pairs per stream, split into `splits` runs per stream (its longest run sets a wave)."""
    waves = -(-ctas * splits // FILL_CTAS)
    merge = MERGE_US + splits * ctas * BLOCK_Q * PART_ROW_BYTES / MERGE_BYTES_PER_US if splits > 1 else 0.0
    return waves * (CTA_US + PAIR_US * -(-pairs // splits)) + merge


def split_count(num_s: int, row_blocks: int, slots: int) -> int:
    """Runs per stream (`context_attention(splits=)`; S * splits CTAs per row block, which
    `runs.run_schedule` shares out by the streams' pairs) for S streams of `row_blocks` 64-row
    blocks and a `slots`-slot cache (a stream walks at most ceil(slots / PAIR) pairs: its whole
    pairs and its tail pair; 65 for 8192 + 1 keys in 8200 slots). The one-wave rule: 1 when the
    S x row_blocks CTAs fill the GPU's SMs, else as many as fit in one wave, each of at least
    MIN_SPLIT_PAIRS pairs. Where the wave model (`split_estimate_us`) estimates another count at
    least 10% lower, the fewest runs estimated within 3% of the lowest: CTAs just past a wave
    (16k Q 17 S 8: 136 CTAs, two waves for 1.03 waves of work) or a wave well short of full (8k Q
    9 S 8: 72 CTAs) split into more runs than one wave holds (context_attention then launches
    each run's row blocks together, so that they share its keys through L2). Measured counts
    against the rule's: docs/kernels/mla_attention.md."""
    ctas, pairs = num_s * row_blocks, -(-slots // PAIR)
    fill = 1 if ctas >= FILL_CTAS else max(1, min(FILL_CTAS // ctas, pairs // MIN_SPLIT_PAIRS))
    est = [split_estimate_us(ctas, pairs, k) for k in range(1, pairs + 1)]
    best = 1 + next(k for k, e in enumerate(est) if e <= WAVE_TIE * min(est))
    gain = split_estimate_us(ctas, pairs, best) < WAVE_GAIN * split_estimate_us(ctas, pairs, fill)
    return best if gain else fill


def tail_words(ctx_lens, node_mask, num_q: int):
    """The tail's visibility per tree node: bit t % 32 of word t // 32 (int32 [S, Q, W], W = 4 x
    the most tail pairs) set where key PAIR * pairs[s] + t (pairs = ctx_lens // PAIR) is the rest
    of the context (below ctx_lens[s]) or tree token u = key - ctx_lens[s] < Q that the node sees
    (node_mask's bit u).
    With c = ctx_lens - PAIR * pairs context keys in the tail, the bits are c ones, then node_mask's
    first Q bits shifted up by c: word w = ones(w) | mask[w - c // 32] << c % 32 | mask[w - c // 32
    - 1] >> (32 - c % 32). Elementwise ops only (the mask word is picked by selects over its
    ceil(Q / 32) words, not gathered, and c >= 0 is split by shifts, not floor divisions), so XLA
    fuses it with `prepare`'s broadcast to rows (one kernel for Q <= 32, two above)."""
    num_s, _, mask_words = node_mask.shape
    num_words = 4 * -(-(PAIR - 1 + num_q) // PAIR)
    keep = np.array([(1 << min(32, max(0, num_q - 32 * i))) - 1 for i in range(mask_words)], np.uint32)
    mask = lax.bitcast_convert_type(node_mask, jnp.uint32) & keep                      # bits >= Q cleared
    c = ctx_lens - PAIR * tail_counts(ctx_lens, num_q)[0]                                 # [S], 0 .. PAIR - 1
    first = jnp.arange(num_words, dtype=c.dtype)[None, :] - lax.shift_right_logical(c, 5)[:, None]  # [S, W]

    def mask_word(i):                                                                    # [S, W] -> [S, Q, W]
        got = jnp.zeros((num_s, num_q, num_words), jnp.uint32)
        for k in range(mask_words):
            got = got | jnp.where((i == k)[:, None, :], mask[:, :, k:k + 1], jnp.uint32(0))
        return got

    b = (c & 31).astype(jnp.uint32)[:, None, None]
    low = jnp.where(b == 0, jnp.uint32(0), lax.shift_right_logical(mask_word(first - 1), jnp.uint32(32) - b))
    ones_n = jnp.clip(c[:, None] - 32 * jnp.arange(num_words, dtype=c.dtype)[None, :], 0, 32).astype(jnp.uint32)
    ones = jnp.where(ones_n == 32, jnp.uint32(0xFFFFFFFF), (jnp.uint32(1) << ones_n) - 1)   # [S, W]
    words = (mask_word(first) << b) | low | ones[:, None, :]
    return lax.bitcast_convert_type(words, jnp.int32)


def decode_words(ctx_lens, node_word, rows: int):
    """context_attention's decode form (node_word [S] int32, the node's mask word) as per-row
    words [S, 4, ceil(rows / 64) * 64] int32 (`tail_words`; zero past rows): what the kernel
    computes from the context length, for its XLA twin and the A/B of the two forms."""
    num_s = node_word.shape[0]
    words = tail_words(ctx_lens.astype(jnp.int32), node_word.reshape(num_s, 1, 1), 1).swapaxes(1, 2)  # [S, W, 1]
    per_row = jnp.broadcast_to(words, (num_s, words.shape[1], rows))
    return jnp.pad(per_row, ((0, 0), (0, 0), (0, -rows % BLOCK_Q)))


def prepare(q, kv, ctx_lens, node_mask, *, heads_first: bool = False, q_rope=None):
    """mla_attention_mosaic's XLA work before the kernel: q [S,Q,H,Dk] (heads_first: [S,H,Q,Dk]),
    kv [S,N,Dk], ctx_lens [S], node_mask [S,Q,ceil(Q/32)] -> context_attention's operands: q rows
    [S, R, Dk] with R = Q * H rounded up to ROW_ALIGN (no copy when H % 8 == 0: the kernel's last
    row block may be partial), kv with N rounded up to a multiple of 8 and at least PAIR, ctx_lens
    [S] int32, tail_bits [S, W, ceil(R / 64) * 64] int32 (`tail_words` per row; zero past Q * H),
    or at Q 1 context_attention's decode form, node_mask [S] (the kernel makes the tail's mask
    itself, so a decode call runs no XLA kernel before the kernel)."""
    if q_rope is not None:
        q = jnp.concatenate([q, q_rope], axis=-1)
    num_s, a, b, dk = q.shape
    num_q = b if heads_first else a
    rows = a * b
    # Rows to a multiple of 8 only: padding a Q * H off a multiple of 64 (8 heads per GPU, Q =
    # budget + 1) to 64 would cost a copy in and a slice out; the last row block is partial instead.
    aligned = -(-rows // ROW_ALIGN) * ROW_ALIGN
    q_rows = q.reshape(num_s, rows, dk)
    q_pad = jnp.pad(q_rows, ((0, 0), (0, aligned - rows), (0, 0))) if aligned > rows else q_rows
    padded = -(-rows // BLOCK_Q) * BLOCK_Q
    ctx_lens = ctx_lens.astype(jnp.int32)
    # TMA reads the cache in (8, 64) tiles and the kernel's first step names keys 0 .. 127: a slot
    # count off a multiple of 8 (model.aligned_slots), or below 128, costs one padded copy.
    pad = max(-kv.shape[1] % 8, PAIR - kv.shape[1])
    kv_k = jnp.pad(kv, ((0, 0), (0, pad), (0, 0))) if pad > 0 else kv
    if num_q == 1:      # decode: the node's mask word as it is, the kernel makes the mask (no XLA kernel here)
        return q_pad, kv_k, ctx_lens, lax.bitcast_convert_type(node_mask, jnp.int32).reshape(num_s)
    words = tail_words(ctx_lens, lax.bitcast_convert_type(node_mask, jnp.int32), num_q)
    # Row r of the flattened query is node r % Q (heads first) or r // H: the node's words tiled
    # or repeated along the rows (a broadcast, no gather); padded rows see no tail key.
    words = words.swapaxes(1, 2)                                                       # [S, W, Q]
    per_row = jnp.tile(words, (1, 1, a)) if heads_first else jnp.repeat(words, b, axis=2)
    tail_bits = jnp.pad(per_row, ((0, 0), (0, 0), (0, padded - rows)))                 # [S, W, R64]
    return q_pad, kv_k, ctx_lens, tail_bits


def launch(q_pad, kv_k, *, splits: int | None = None, balance: bool = False) -> tuple[int, int]:
    """(CTAs per cluster, runs per stream on average) for prepare's q rows and cache; splits None:
    split_count, except that with balance and S > 1 a call split_count leaves unsplit within one
    wave (S * R / 64 <= FILL_CTAS CTAs) takes 2 runs per stream when the cache holds more than one
    pair: unsplit, every CTA would start at once and the longest stream's would set the time (its
    order cannot help), while 2 * S runs shared out by the streams' pairs, launched longest run
    first, fill two waves, for one more fixed cost per CTA and the merge. Past one wave balance
    keeps 1 run per stream and launches the streams longest first (context_attention).
    Measurements: docs/kernels/mla_attention.md."""
    num_s, rows = q_pad.shape[:2]
    cluster = cluster_size(rows)
    if splits is None:
        blocks = -(-rows // BLOCK_Q)
        ctas = num_s * blocks
        splits = split_count(num_s, blocks, kv_k.shape[1])
        if balance and num_s > 1 and splits == 1 and ctas <= FILL_CTAS and kv_k.shape[1] > PAIR:
            splits = 2
    return cluster, splits


MERGES = ("pallas", "xla")   # how split runs are merged: merge.merge_splits (one kernel, its form
                             # by merge.form_for) or combine_splits (2-5 XLA kernels)


def merge_runs(o, lse, ctx_lens, out_dtype, *, num_q: int, merge: str = "pallas", balance: bool = False):
    """The split runs' parts (O [W, R, v], lse2 [W, R] float32 of `context_attention(splits > 1,
    balance)` for contexts ctx_lens [S] and num_q tree tokens) -> O [S, R, v] out_dtype, merged as
    `merge` says (MERGES). The Pallas merge (the default) is the faster at every run count
    measured; "xla" is the baseline."""
    if merge not in MERGES:
        raise ValueError(f"merge must be one of {MERGES}, got {merge!r}")
    if merge == "pallas":
        return merge_splits(o, lse, ctx_lens, out_dtype, num_q=num_q, balance=balance)
    return combine_splits(o, lse, ctx_lens, num_q=num_q, balance=balance).astype(out_dtype)


@functools.partial(jax.jit, static_argnames=("scale", "v_dim", "heads_first", "context", "splits", "merge",
                                             "balance"))
def mla_attention_mosaic(q, kv, ctx_lens, node_mask, *, scale: float, v_dim: int,
                         heads_first: bool = False, q_rope=None, context=context_attention,
                         splits: int | None = None, merge: str = "pallas", balance: bool = False):
    """q [S,Q,H,Dk] (heads_first: [S,H,Q,Dk]), kv [S,N,Dk], ctx_lens [S] int32,
    node_mask [S,Q,ceil(Q/32)] int32 -> [S,Q,H,v_dim] (heads_first: [S,H,Q,v_dim]) in q.dtype.
    context: the whole-pairs part (the kernel; its XLA twin in CPU tests). splits: runs each
    stream's context is split into (None: `split_count`'s rule). merge: how the runs are merged
    (MERGES: one Pallas:Triton kernel or XLA's combine_splits). balance: share the split runs
    out by the streams' pairs, or launch an unsplit call's streams longest first
    (context_attention's balance and `launch`: for ragged contexts; nothing with one stream)."""
    if merge not in MERGES:
        raise ValueError(f"merge must be one of {MERGES}, got {merge!r}")
    num_s, a, b, _ = q.shape
    balance = balance and num_s > 1     # one stream: the schedule would be the equal one, at its cost
    operands = prepare(q, kv, ctx_lens, node_mask, heads_first=heads_first, q_rope=q_rope)
    cluster, splits = launch(*operands[:2], splits=splits, balance=balance)
    kw = dict(num_q=b if heads_first else a, scale=scale, v_dim=v_dim, cluster=cluster)
    if splits == 1:
        out, _ = context(*operands, balance=balance, **kw)
    else:       # too few row blocks to fill the GPU: split the context, merge the runs here
        parts = context(*operands, splits=splits, balance=balance, **kw)
        out = merge_runs(*parts, operands[2], q.dtype, num_q=kw["num_q"], merge=merge, balance=balance)
    return out[:, :a * b].reshape(num_s, a, b, v_dim)


def is_hopper() -> bool:
    """Whether the default device is a Hopper GPU (compute capability 9.x: wgmma, TMA, clusters)."""
    dev = jax.devices()[0]
    return dev.platform == "gpu" and str(getattr(dev, "compute_capability", "")).startswith("9.")


# impl="auto" takes this kernel for a cache of AUTO_MIN_SLOTS slots or more, or for AUTO_MIN_CTAS
# row blocks (S * ceil(Q * H / 64)) or more; below both (short caches with plain decode or one
# small tree) pallas_triton is as fast or faster (docs/kernels/mla_attention.md).
AUTO_MIN_SLOTS = 4096
AUTO_MIN_CTAS = 128


def supports(q, kv, ctx_lens, node_mask, *, scale: float, v_dim: int, heads_first: bool = False,
             q_rope=None, balance: bool = False) -> str | None:
    """Why the registered "mosaic_gpu" implementation cannot take this call, or None."""
    del ctx_lens, node_mask, scale, heads_first, balance
    if not is_hopper():
        return ("needs a Hopper GPU (Pallas Mosaic GPU has no CPU interpreter for this kernel); "
                "use 'xla' or 'pallas_triton'")
    dk = q.shape[-1] + (0 if q_rope is None else q_rope.shape[-1])
    if why := supported(dk, v_dim, q.dtype):
        return why
    if kv.dtype != q.dtype:
        return f"kv dtype {kv.dtype} must equal q's {q.dtype}"
    return None


@registry.chooser("mla_attention")
def choose(q, kv, ctx_lens, node_mask, *, scale: float, v_dim: int, heads_first: bool = False,
           q_rope=None, balance: bool = False) -> str:
    """impl="auto" on a GPU: "mosaic_gpu" when the cache has AUTO_MIN_SLOTS slots or the call
    AUTO_MIN_CTAS row blocks (too few CTAs are made up by `split_count`), else "pallas_triton"
    (the registry falls back from either when its `supports` rule refuses the call)."""
    del ctx_lens, node_mask, scale, v_dim, heads_first, q_rope, balance
    num_s, a, b, _ = q.shape
    big = kv.shape[1] >= AUTO_MIN_SLOTS or num_s * -(-a * b // BLOCK_Q) >= AUTO_MIN_CTAS
    return "mosaic_gpu" if big else "pallas_triton"


@registry.register("mla_attention", "mosaic_gpu", supports=supports)
def _registered(q, kv, ctx_lens, node_mask, *, scale: float, v_dim: int,
                heads_first: bool = False, q_rope=None, balance: bool = False) -> jax.Array:
    if why := supports(q, kv, ctx_lens, node_mask, scale=scale, v_dim=v_dim, q_rope=q_rope):
        raise ValueError(f"mla_attention impl 'mosaic_gpu': {why}")
    return mla_attention_mosaic(q, kv, ctx_lens, node_mask, scale=scale, v_dim=v_dim,
                                heads_first=heads_first, q_rope=q_rope, balance=balance)
