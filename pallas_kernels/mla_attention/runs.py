"""How the Mosaic GPU kernel walks a stream's keys, and how split calls share their CTAs out.

The kernel walks each stream's keys in 128-key pairs: its whole context pairs, then the tail
pairs (the last ctx % 128 context keys and the Q tree tokens, in 64-key tiles; a run that ends
in half a pair loads and takes that tile first: `load_schedule`). With too few row blocks to fill
the GPU, the W CTAs of each row block are shared out among the streams as runs of consecutive
pairs (`run_schedule`), in proportion to the pairs each stream walks: with ragged contexts a long
stream gets more runs, so every run walks about U / W of the U pairs in all (with W / S runs for
every stream the longest stream's runs would set the time). CTA f of a row block is run k of
stream s, in stream order (`run_of`); its part of the output is part f, and the merge finds
stream s's parts at first[s] .. first[s] + count[s] - 1 by the same rule. The rule uses int32
scalar ops only, on a Python list of the S streams' totals, so the kernel, the merge kernel and
their XLA twins compute the same schedule (and need no XLA kernel to pass it between them).
Unsplit calls (one CTA per row block and stream) cannot share a stream's work out; with balance
they launch the streams longest first instead (`stream_order`), so that the long streams' CTAs
are not left for the last wave; split calls past one wave likewise launch their runs longest
first (`part_order`, from the schedule in array ops, `part_runs`).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

BLOCK_K = 64        # keys per tile
PAIR = 2 * BLOCK_K  # keys per step of the kernel's two consumers


def tail_counts(ctx_lens, num_q: int):
    """(whole context pairs, tail tiles) for contexts ctx_lens >= 0 and num_q tree tokens: the
    tail holds the last ctx_lens % 128 context keys and the tree tokens, in 64-key tiles."""
    pairs = lax.div(ctx_lens, PAIR)     # lax.div: no floor-division selects (ctx_lens >= 0)
    return pairs, lax.div(ctx_lens - PAIR * pairs + (num_q + BLOCK_K - 1), BLOCK_K)


def total_pairs(ctx_len, num_q: int):
    """The pairs a stream of context ctx_len and num_q tree tokens walks: its whole pairs and its
    tail pairs (an odd tail ends in half a pair)."""
    pairs, tail_tiles = tail_counts(ctx_len, num_q)
    return pairs + lax.div(tail_tiles + 1, 2)


def run_bounds(total, runs, k):
    """Run k's (first pair, pairs) of a stream's `total` pairs split into `runs` runs: total //
    runs each, and one more for each of the last total % runs runs (the last run holds the
    tail, whose last pair may be half a pair). Python or traced ints."""
    per, rem = lax.div(total, runs), lax.rem(total, runs)
    extra = jnp.maximum(k - (runs - rem), 0)
    return k * per + extra, per + (k >= runs - rem).astype(per.dtype)


def load_schedule(j, num_tiles, half_tail):
    """(tile, key slot) of a run's j-th key load, for a run of num_tiles 64-key tiles that ends in
    half a pair when half_tail is 1 (its tail's odd last tile). Without: tile j into slot j % 2.
    With: that last tile first, into slot 1, then tiles 0 .. num_tiles - 2 in order, tile t into
    slot t % 2. Either way every whole pair's first tile, which consumer 0 scores first, lies in
    slot 0 and is loaded before the pair's second, so consumer 0 never waits on the slot freed
    last. Python or traced ints."""
    tile = jnp.where(half_tail == 1, jnp.where(j == 0, num_tiles - 1, j - 1), j)
    return tile, lax.rem(j + half_tail, 2)


def _weights(totals: list) -> tuple[list, object]:
    """The pairs the schedule shares the CTAs by, and their sum: the totals, or one each when
    every total is 0 (so the CTAs are still all shared out, as empty runs)."""
    u = sum(totals[1:], totals[0])
    none = (u == 0).astype(jnp.int32)
    return [t + none for t in totals], u + none * len(totals)


def run_schedule(totals: list, width: int) -> tuple[list, list]:
    """Runs per stream for `totals` (a list of S int32 scalars: the pairs each stream walks)
    sharing `width` >= S CTAs -> (count, first): lists of S int32 scalars, stream s's runs being
    CTAs first[s] .. first[s] + count[s] - 1. Every stream gets one run, and the other width - S
    go by cumulative rounding of the streams' pairs: with C_s the pairs of the streams before s,
    U all pairs and b(C) = round((width - S) * C / U) (halves up), first[s] = s + b(C_s) and
    count[s] = 1 + b(C_s + totals[s]) - b(C_s). So sum(count) == width, uniform totals get width /
    S runs each, and a stream's run count is within one of its share (all totals 0: as if 1)."""
    num_s = len(totals)
    if not 1 <= num_s <= width:
        raise ValueError(f"run_schedule: needs 1 <= S <= width; got S={num_s}, width={width}")
    totals, u = _weights(totals)
    spare = width - num_s
    before = [jnp.int32(0)]
    for t in totals:
        before.append(before[-1] + t)
    b = [lax.div(2 * spare * c + u, 2 * u) for c in before]
    return [1 + b[j + 1] - b[j] for j in range(num_s)], [j + b[j] for j in range(num_s)]


def run_of(f, totals: list, width: int):
    """CTA f's (stream s, run k of s, count[s]) under `run_schedule(totals, width)`, with S
    multiply-compares and two divisions (not S divisions): first[j] <= f exactly when
    2 (width - S) C_j + U < 2 U (f - j + 1). int32: needs 2 * width * U < 2^31."""
    num_s = len(totals)
    totals, u = _weights(totals)
    spare = width - num_s
    before = [jnp.int32(0)]
    for t in totals[:-1]:
        before.append(before[-1] + t)
    s = sum(((j <= f) & (2 * spare * before[j] + u < 2 * u * (f - j + 1))).astype(jnp.int32)
            for j in range(1, num_s)) + jnp.int32(0)
    c = pick(before, s)
    b, b_next = lax.div(2 * spare * c + u, 2 * u), lax.div(2 * spare * (c + pick(totals, s)) + u, 2 * u)
    return s, f - s - b, 1 + b_next - b


def stream_runs(totals: list, width: int, s):
    """(first, count) of stream s's runs under `run_schedule(totals, width)`, for a traced s,
    with two divisions (the merge's programs, one stream each)."""
    num_s = len(totals)
    totals, u = _weights(totals)
    spare = width - num_s
    c = sum((jnp.where(j < s, t, 0) for j, t in enumerate(totals)), jnp.int32(0))
    b, b_next = lax.div(2 * spare * c + u, 2 * u), lax.div(2 * spare * (c + pick(totals, s)) + u, 2 * u)
    return s + b, 1 + b_next - b


def pick(values: list, s):
    """values[s] for a traced stream index s (selects over the list, no gather)."""
    return sum((jnp.where(s == j, v, 0) for j, v in enumerate(values)), jnp.zeros_like(values[0]))


def stream_order(ctx_lens, num_q: int):
    """The streams by the pairs they walk, most first (ties in stream order): int32 [S] for
    contexts ctx_lens [S] (an array; XLA code). Unsplit calls with balance launch their CTAs in
    this order, so the longest streams' CTAs start in the first wave and the short ones fill the
    SMs that free up (longest processing time first)."""
    totals = total_pairs(ctx_lens.astype(jnp.int32), num_q)
    return jnp.argsort(-totals, stable=True).astype(jnp.int32)


def part_runs(ctx_lens, num_q: int, width: int, balance: bool = True):
    """The schedule of `width` CTAs for contexts ctx_lens [S] (an array) as arrays, for XLA code:
    (stream [W], first pair [W], pairs [W]) of each CTA's run, by run_schedule's rule in array ops
    (balance False: width / S runs for every stream, CTA f run f % (W / S) of stream f // (W / S))."""
    num_s = ctx_lens.shape[0]
    totals = total_pairs(ctx_lens.astype(jnp.int32), num_q)                     # [S]
    f = jnp.arange(width, dtype=jnp.int32)
    if balance:
        if not 1 <= num_s <= width:
            raise ValueError(f"part_runs: needs 1 <= S <= width; got S={num_s}, width={width}")
        weights, u = _weights(list(totals))
        below = jnp.arange(num_s + 1)[:, None] > jnp.arange(num_s)[None, :]                # [S + 1, S]
        edges = jnp.where(below, jnp.stack(weights)[None, :], 0).sum(1, dtype=jnp.int32)     # [S + 1]: pairs before
        b = lax.div(2 * (width - num_s) * edges + u, 2 * u)
        count, first = 1 + b[1:] - b[:-1], jnp.arange(num_s, dtype=jnp.int32) + b[:-1]
        stream = (first[None, :] <= f[:, None]).sum(1).astype(jnp.int32) - 1          # [W]
        k = f - first[stream]
        count = count[stream]
    else:
        per = width // num_s
        stream, k, count = f // per, f % per, jnp.full(width, per, jnp.int32)
    return (stream, *run_bounds(totals[stream], count, k))


def part_order(ctx_lens, num_q: int, width: int):
    """The CTAs of a row block by the pairs of their runs (`part_runs` with balance), most first
    (ties in CTA order): int32 [W] for contexts ctx_lens [S] (an array; XLA code). Split calls
    with balance whose CTAs exceed one wave launch them in this order, all row blocks of the
    longest run first, so the long runs are not left for the last wave. A rank by [W, W]
    comparisons and its inverse by [W, W] selects, not a sort: XLA fuses them with the schedule's
    element-wise ops."""
    pairs = part_runs(ctx_lens, num_q, width)[2]                                       # [W]
    f = jnp.arange(width, dtype=jnp.int32)
    ahead = (pairs[None, :] > pairs[:, None]) | ((pairs[None, :] == pairs[:, None]) & (f[None, :] < f[:, None]))
    rank = ahead.sum(1, dtype=jnp.int32)                                                # [W]: CTAs launched before f
    return jnp.where(rank[None, :] == f[:, None], f[None, :], 0).sum(1, dtype=jnp.int32)
