"""The split runs' merge kernel (pallas_kernels/mla_attention/merge.py) and the schedule it shares
with the Mosaic GPU kernel (runs.py), against float64 numpy: each stream's parts found by the
schedule written out in Python ints, parts that saw no key (-inf lse), rows no part saw (zeros),
ragged contexts (a long stream with many parts, short ones with one), a stream's part count not a multiple of
the step, one part, float32 and bf16 parts; outputs NaN-poisoned before the run."""

import math
from fractions import Fraction

import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.mla_attention import merge, runs
from tests.kernel_testing import assert_close, fresh_rng


def totals_py(ctx, num_q):
    """Pairs each stream walks: its whole 128-key pairs, then ceil(tail tiles / 2) tail pairs."""
    return [c // 128 + (-(-(c % 128 + num_q) // 64) + 1) // 2 for c in ctx]


def schedule_py(totals, width):
    """run_schedule's rule in exact fractions: one run per stream, the other width - S by
    cumulative rounding (halves up) of the streams' pairs (all 0: as if 1 each) -> (count, first)."""
    if not any(totals):
        totals = [1] * len(totals)
    num_s, u = len(totals), sum(totals)
    before = [sum(totals[:j]) for j in range(num_s + 1)]
    b = [math.floor(Fraction((width - num_s) * c, u) + Fraction(1, 2)) for c in before]
    return [1 + b[j + 1] - b[j] for j in range(num_s)], [j + b[j] for j in range(num_s)]


def golden(o, lse, count, first):
    o, lse = np.asarray(o, np.float64), np.asarray(lse, np.float64)
    out = []
    for c, f in zip(count, first):
        lo, ls = o[f:f + c], lse[f:f + c]
        top = ls.max(0)
        w = np.exp2(ls - np.where(np.isfinite(top), top, 0.0))
        den = w.sum(0)
        out.append((w[..., None] * lo).sum(0) / np.where(den > 0, den, 1.0)[..., None])
    return np.stack(out)


def test_schedule_matches_its_rule_and_balances():
    """run_schedule, run_of and stream_runs (int32 scalar ops, as the kernels run them) equal the
    rule in exact fractions on random ragged totals, with every CTA in a run; uniform totals get
    width / S runs each; a spread of contexts gets runs within 1.15x of the ideal length where
    equal run counts would be 1.9x; part_runs walks each stream's pairs in order."""
    rng = fresh_rng()
    for _ in range(30):
        num_s = int(rng.integers(1, 20))
        width = int(rng.integers(num_s, 140))
        totals = [int(t) for t in rng.integers(0, 300, num_s)]
        want = schedule_py(totals, width)
        traced = [jnp.int32(t) for t in totals]
        count, first = runs.run_schedule(traced, width)
        assert ([int(c) for c in count], [int(f) for f in first]) == want, (totals, width)
        assert sum(want[0]) == width and min(want[0]) >= 1
        for s in rng.choice(num_s, min(num_s, 4), replace=False):
            assert [int(x) for x in runs.stream_runs(traced, width, jnp.int32(s))] == [want[1][s], want[0][s]]
            for k in {0, want[0][s] - 1}:                   # each stream's first and last run
                got = [int(x) for x in runs.run_of(jnp.int32(want[1][s] + k), traced, width)]
                assert got == [s, k, want[0][s]], (totals, width, s, k, got)
    assert schedule_py([65] * 16, 128)[0] == [8] * 16 and schedule_py([257] * 8, 128)[0] == [16] * 8
    zeros = [jnp.int32(0)] * 3                                   # no pairs anywhere: still every CTA
    assert [int(c) for c in runs.run_schedule(zeros, 7)[0]] == schedule_py([0] * 3, 7)[0] == [2, 3, 2]
    assert [int(x) for x in runs.run_of(jnp.int32(6), zeros, 7)] == [2, 1, 2]
    spread = [(2 * j + 1) * 8 for j in range(16)]              # 16 streams, 1k .. 31k keys at decode
    count, _ = schedule_py(spread, 128)
    ideal = sum(spread) / 128
    assert max(-(-t // c) for t, c in zip(spread, count)) <= 1.15 * ideal
    assert max(-(-t // 8) for t in spread) >= 1.9 * ideal       # 8 runs each
    ctx = [0, 130, 996, 8192]
    stream, first_pair, pairs = (np.asarray(a) for a in runs.part_runs(jnp.asarray(ctx), 70, 14))
    count, first = schedule_py(totals_py(ctx, 70), 14)
    assert count == [1, 1, 3, 9]
    for s in range(4):
        mine = slice(first[s], first[s] + count[s])
        assert (stream[mine] == s).all() and pairs[mine].sum() == totals_py(ctx, 70)[s]
        assert (first_pair[mine] == np.concatenate([[0], np.cumsum(pairs[mine])[:-1]])).all()


def test_stream_order_is_longest_first_and_stable():
    """stream_order: the streams by the pairs they walk (whole context pairs and tail pairs, as
    totals_py counts them), most first, equal totals in stream order; random ragged contexts."""
    rng = fresh_rng()
    for num_s in (1, 3, 16, 37, 37, 37):       # few shapes: each new one compiles the eager ops
        num_q = int(rng.integers(1, 300))
        ctx = [int(c) for c in rng.integers(0, 4, num_s) * int(rng.integers(1, 3000))]   # ties likely
        totals = totals_py(ctx, num_q)
        want = sorted(range(num_s), key=lambda j: (-totals[j], j))
        assert [int(j) for j in runs.stream_order(jnp.asarray(ctx), num_q)] == want, (ctx, num_q)
    assert [int(j) for j in runs.stream_order(jnp.asarray([0, 130, 996, 8192]), 70)] == [3, 2, 1, 0]


def test_part_order_is_longest_run_first_and_stable():
    """part_order: a row block's CTAs by the pairs of their runs under run_schedule's rule (each
    stream's total split by run_bounds: the remainder to its last runs), most first, ties in CTA
    order; part_runs' arrays as the rule gives them, random ragged contexts and widths."""
    rng = fresh_rng()
    for num_s, width in ((1, 5), (3, 7), (8, 16), (16, 48)):
        num_q = int(rng.integers(1, 300))
        ctx = [int(c) for c in rng.integers(0, 5, num_s) * int(rng.integers(1, 4000))]   # ties likely
        totals = totals_py(ctx, num_q)
        count, first = schedule_py(totals, width)
        pairs = [totals[s] // count[s] + (k >= count[s] - totals[s] % count[s])
                 for s in range(num_s) for k in range(count[s])]
        stream, first_pair, got_pairs = (np.asarray(a) for a in runs.part_runs(jnp.asarray(ctx), num_q, width))
        assert got_pairs.tolist() == pairs and stream.tolist() == [s for s in range(num_s) for _ in range(count[s])]
        assert all(first_pair[first[s]] == 0 for s in range(num_s))
        want = sorted(range(width), key=lambda f: (-pairs[f], f))
        assert [int(f) for f in runs.part_order(jnp.asarray(ctx), num_q, width)] == want, (ctx, num_q, width)


def test_load_schedule_loads_every_pair_first_tile_first():
    """runs.load_schedule: each tile of a run loaded once; consecutive loads alternate the two
    slots (the producer's ring); with half a pair, that tile (the last) first, in slot 1; every
    whole pair after it in order, its first tile (consumer 0's) in slot 0 and loaded first."""
    for num_tiles in range(1, 10):
        for half_tail in ((0, 1) if num_tiles % 2 else (0,)):
            got = [tuple(int(x) for x in runs.load_schedule(j, num_tiles, half_tail)) for j in range(num_tiles)]
            tiles, slots = zip(*got)
            assert sorted(tiles) == list(range(num_tiles)), got
            assert all(slots[j] != slots[j + 1] for j in range(num_tiles - 1)), got
            if half_tail:
                assert got[0] == (num_tiles - 1, 1), got
            pairs = got[half_tail:]
            assert all(pairs[k] == (pairs[0][0] + k, k % 2) for k in range(len(pairs))), got
            assert pairs[:1] in ([], [(0, 0)]), got


@pytest.mark.parametrize("balance", [True, False])
@pytest.mark.parametrize("form", merge.FORMS)
@pytest.mark.parametrize("ctx,num_q,splits,r,v,kc,br,dtype", [
    ([500], 1, 1, 8, 64, 16, 8, jnp.bfloat16),                     # one part
    ([300, 2000], 5, 3, 16, 128, 2, 16, jnp.float32),              # 1 and 5 parts
    ([8000], 1, 16, 64, 64, 16, 64, jnp.bfloat16),                 # 64 rows per program: 2 parts a step
    ([8000], 1, 16, 64, 64, 16, 8, jnp.bfloat16),
    ([100, 9000, 0], 1, 5, 8, 64, 4, 8, jnp.bfloat16),             # 1, 13 and 1 parts; 0 idle
    ([0, 0, 300, 5000], 1, 5, 32, 32, 16, 32, jnp.float32),        # 1, 1, 2, 16 parts
])
def test_merge_matches_golden(ctx, num_q, splits, r, v, kc, br, dtype, form, balance):
    """Stream parts counts not multiples of kc: "parts" masks the parts past the stream's in its
    last step (loads past the arrays, predicated off) and must count none of them. balance False:
    `splits` parts per stream, in stream order. br: rows per program (its parts per step kc * 8 / br)."""
    rng = fresh_rng()
    s, width = len(ctx), len(ctx) * splits
    count, first = (schedule_py(totals_py(ctx, num_q), width) if balance
                    else ([splits] * s, [k * splits for k in range(s)]))
    o = rng.standard_normal((width, r, v))
    lse = (rng.standard_normal((width, r)) * 4).astype(np.float32)
    lse[0, :2] = -np.inf                          # a part that saw no key for two rows
    if count[-1] > 1:
        lse[first[-1]:first[-1] + count[-1], 3] = -np.inf   # a row no part of the last stream saw
    o = jnp.asarray(o, dtype)
    lens = jnp.asarray(ctx, jnp.int32)
    out = merge.merge_splits(o, jnp.asarray(lse), lens, jnp.float32, jnp.full((s, r, v), jnp.nan, jnp.float32),
                             num_q=num_q, balance=balance, kc=kc, form=form, br=br)
    want = golden(o, lse, count, first)
    assert np.all(np.isfinite(np.asarray(out)))
    if count[-1] > 1:
        assert np.all(np.asarray(out)[-1, 3] == 0)
    assert_close(out, want, 1e-6, f"merge ctx {ctx}")
    out16 = merge.merge_splits(o, jnp.asarray(lse), lens, jnp.bfloat16, num_q=num_q, balance=balance, kc=kc,
                               form=form, br=br)
    assert out16.dtype == jnp.bfloat16
    assert_close(out16, want, 8e-3, f"merge ctx {ctx} bf16 out")


def test_merge_refuses_bad_shapes():
    o, lens = jnp.zeros((2, 8, 64), jnp.bfloat16), jnp.zeros((1,), jnp.int32)
    with pytest.raises(ValueError, match="lse"):
        merge.merge_splits(o, jnp.zeros((2, 4), jnp.float32), lens, num_q=1)
    with pytest.raises(ValueError, match="rows"):
        merge.merge_splits(jnp.zeros((2, 6, 64)), jnp.zeros((2, 6), jnp.float32), lens, num_q=1)
    with pytest.raises(ValueError, match="ctx_lens"):
        merge.merge_splits(o, jnp.zeros((2, 8), jnp.float32), jnp.zeros((3,), jnp.int32), num_q=1)   # W % S
    with pytest.raises(ValueError, match="out"):
        merge.merge_splits(o, jnp.zeros((2, 8), jnp.float32), lens, num_q=1, out=jnp.zeros((1, 8, 32)))
    with pytest.raises(ValueError, match="form"):
        merge.merge_splits(o, jnp.zeros((2, 8), jnp.float32), lens, num_q=1, form="columns")
    with pytest.raises(ValueError, match="kc"):
        merge.merge_splits(o, jnp.zeros((2, 8), jnp.float32), lens, num_q=1, kc=12)
    for br in (4, 12, 16):                  # below 8, not a power of two, not dividing the 8 rows
        with pytest.raises(ValueError, match="br must be"):
            merge.merge_splits(o, jnp.zeros((2, 8), jnp.float32), lens, num_q=1, br=br)


def test_merge_form_for_the_run_count():
    """form=None takes form_for(W / S): "rows" up to 16 runs, "parts" above; either form gives the
    other's numbers (float32 sums in another order) and the golden's."""
    assert [merge.form_for(k) for k in (1, 8, 16, 17, 65, 132)] == ["rows"] * 3 + ["parts"] * 3
    assert [merge.rows_per_program(s, r, "rows") for s, r in ((16, 64), (1, 1024), (4, 1024), (8, 1024), (64, 1024),
                                                             (8, 72))] == [8, 8, 32, 64, 64, 8]
    assert merge.rows_per_program(8, 1024, "parts") == 8
    rng = fresh_rng()
    for k in (16, 17):
        o = jnp.asarray(rng.standard_normal((k, 8, 64)), jnp.bfloat16)
        lse = jnp.asarray(rng.standard_normal((k, 8)) * 4, jnp.float32)
        lens = jnp.asarray([128 * k], jnp.int32)
        other = {"rows": "parts", "parts": "rows"}[merge.form_for(k)]
        auto = merge.merge_splits(o, lse, lens, num_q=1, balance=True)
        assert_close(auto, merge.merge_splits(o, lse, lens, num_q=1, form=other), 1e-6, f"merge K{k}: the two forms")
        assert_close(auto, golden(o, lse, [k], [0]), 1e-6, f"merge K{k} form=None")


def test_mosaic_refuses_an_unknown_merge():
    from pallas_kernels.mla_attention import mosaic_gpu
    with pytest.raises(ValueError, match="merge must be one of"):
        mosaic_gpu.mla_attention_mosaic(jnp.zeros((1, 1, 1, 64)), jnp.zeros((1, 128, 64)), jnp.zeros((1,), jnp.int32),
                                        jnp.zeros((1, 1, 1), jnp.int32), scale=0.1, v_dim=32, merge="nope")
