"""MLA tree-verify attention: every implementation against the float64 numpy golden.

Cases: random trees (chain, star, bushy, single node) and arbitrary masks, ragged contexts
including 0 and N - Q, Q not a power of two and above 32 (two mask words), contexts not a
multiple of any block, a Kimi-K2 head layout (Dk 512 + 64). Pallas runs in interpret mode off
the GPU, with NaN-poisoned (aliased) output buffers so unwritten rows fail.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import registry
from pallas_kernels.mla_attention import (mla_attention, mask_to_visibility, mosaic_gpu, pallas_triton, runs, two_pass,
                                          visibility_to_mask, xla)
from pallas_kernels.mla_attention.reference import (mla_attention_reference,
                                                    visibility_from_mask_reference)
from tests.kernel_testing import assert_close, fresh_rng, runnable_impls

# bf16: inputs and P rounded to bf16, softmax and sums in float32. Errors lie at 1.7-3.0e-3 here
# (xla, pallas_triton, the mosaic parts) and at 2.1-3.1e-3 for the compiled kernels on an H200.
TOL = {jnp.float32: 1e-5, jnp.bfloat16: 6e-3}


def tree_visibility(rng, num_q: int, kind: str) -> np.ndarray:
    """[Q, Q] ancestor-or-self visibility of a random tree (node 0 = root), or a random mask."""
    if kind == "random":
        return rng.random((num_q, num_q)) < 0.4
    parents = np.full(num_q, -1)
    for i in range(1, num_q):
        parents[i] = {"chain": i - 1, "star": 0, "bushy": int(rng.integers(0, i))}[kind]
    vis = np.zeros((num_q, num_q), bool)
    for i in range(num_q):
        j = i
        while j >= 0:
            vis[i, j], j = True, parents[j]
    return vis


def make_case(num_s, num_q, num_h, dk, v_dim, num_slots, ctx, kinds, dtype):
    rng = fresh_rng()
    q = jnp.asarray(rng.standard_normal((num_s, num_q, num_h, dk)), dtype)
    kv = jnp.asarray(rng.standard_normal((num_s, num_slots, dk)), dtype)
    vis = np.stack([tree_visibility(rng, num_q, kinds[s % len(kinds)]) for s in range(num_s)])
    return q, kv, jnp.asarray(ctx, jnp.int32), visibility_to_mask(vis), vis


CASES = {
    # name: (S, Q, H, Dk, v_dim, N, ctx_lens, tree kinds, dtype)
    "bushy_ragged": (3, 5, 4, 40, 32, 50, [0, 17, 45], ["bushy", "chain", "random"], jnp.float32),
    "two_words_bf16": (2, 37, 2, 24, 16, 120, [83, 1], ["bushy", "star"], jnp.bfloat16),
    "single_node": (2, 1, 3, 24, 16, 70, [69, 0], ["chain"], jnp.float32),
    "k2_heads": (1, 3, 8, 576, 512, 100, [97], ["bushy"], jnp.bfloat16),
    # the shipped pair's verify at budget 55 (two mask words, a 64 + 16 latent)
    "pair_budget55": (1, 56, 4, 80, 64, 184, [108], ["bushy"], jnp.bfloat16),
}


def refused(impl, q, dk, v_dim, call) -> bool:
    """mosaic_gpu refuses shapes and dtypes its kernel cannot take: check that it says why."""
    why = mosaic_gpu.supported(dk, v_dim, q.dtype) if impl == "mosaic_gpu" else None
    if why:
        with pytest.raises(ValueError, match=re.escape(why)):
            call()
    return why is not None


@pytest.mark.parametrize("impl", runnable_impls("mla_attention"))
@pytest.mark.parametrize("case", list(CASES))
def test_matches_golden(impl, case):
    num_s, num_q, num_h, dk, v_dim, n, ctx, kinds, dtype = CASES[case]
    q, kv, ctx_lens, node_mask, _ = make_case(num_s, num_q, num_h, dk, v_dim,
                                              n, ctx, kinds, dtype)
    scale = dk ** -0.5
    call = lambda: mla_attention(q, kv, ctx_lens, node_mask, scale=scale, v_dim=v_dim, impl=impl)
    if refused(impl, q, dk, v_dim, call):
        return
    out = call()
    assert out.shape == (num_s, num_q, num_h, v_dim) and out.dtype == dtype
    ref = mla_attention_reference(q, kv, ctx_lens, node_mask, scale=scale, v_dim=v_dim)
    assert_close(out, ref, TOL[dtype], f"{impl}/{case}")


@pytest.mark.parametrize("impl", runnable_impls("mla_attention"))
@pytest.mark.parametrize("case", ["bushy_ragged", "two_words_bf16", "pair_budget55"])
def test_heads_first_layout(impl, case):
    """q [S,H,Q,Dk] with heads_first=True gives the [S,H,Q,v] transpose of the golden: rows are
    (head, node) pairs, each node keeping its own mask row."""
    num_s, num_q, num_h, dk, v_dim, n, ctx, kinds, dtype = CASES[case]
    q, kv, ctx_lens, node_mask, _ = make_case(num_s, num_q, num_h, dk, v_dim,
                                              n, ctx, kinds, dtype)
    scale = dk ** -0.5
    call = lambda: mla_attention(q.swapaxes(1, 2), kv, ctx_lens, node_mask, scale=scale, v_dim=v_dim,
                                 impl=impl, heads_first=True)
    if refused(impl, q, dk, v_dim, call):
        return
    out = call()
    assert out.shape == (num_s, num_h, num_q, v_dim) and out.dtype == dtype
    ref = mla_attention_reference(q, kv, ctx_lens, node_mask, scale=scale, v_dim=v_dim)
    assert_close(out.swapaxes(1, 2), ref, TOL[dtype], f"{impl}/{case}/heads_first")


@pytest.mark.parametrize("impl", runnable_impls("mla_attention"))
@pytest.mark.parametrize("heads_first", [False, True])
def test_rope_part_given_apart(impl, heads_first):
    """q_rope: the latent part in q and the rope part in q_rope give the golden of their
    concatenation (the model passes them apart so no [.., Dk] query is written)."""
    num_s, num_q, num_h, dk, v_dim, n, ctx, kinds, dtype = CASES["two_words_bf16"]
    q, kv, ctx_lens, node_mask, _ = make_case(num_s, num_q, num_h, dk, v_dim, n, ctx, kinds, dtype)
    lay = (lambda a: a.swapaxes(1, 2)) if heads_first else (lambda a: a)
    call = lambda: mla_attention(lay(q[..., :v_dim]), kv, ctx_lens, node_mask, scale=0.3, v_dim=v_dim,
                                 impl=impl, heads_first=heads_first, q_rope=lay(q[..., v_dim:]))
    if refused(impl, q, dk, v_dim, call):
        return
    out = call()
    ref = mla_attention_reference(q, kv, ctx_lens, node_mask, scale=0.3, v_dim=v_dim)
    assert_close(lay(out), ref, TOL[dtype], f"{impl}/q_rope/heads_first={heads_first}")
    whole = mla_attention(lay(q), kv, ctx_lens, node_mask, scale=0.3, v_dim=v_dim, impl=impl,
                          heads_first=heads_first)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(whole))   # same values, same math


def test_pallas_rope_apart_poisoned_splits():
    """q_rope through one and several context splits into NaN-poisoned buffers."""
    q, kv, ctx_lens, node_mask, _ = make_case(2, 21, 3, 24, 16, 120, [90, 0], ["random", "star"],
                                              jnp.float32)
    for cfg in (pallas_triton.BlockConfig(block_m=16, block_n=16, num_warps=4, num_splits=3),
                pallas_triton.BlockConfig(block_m=16, block_n=16, num_warps=4, num_splits=1)):
        out = pallas_triton.mla_attention_pallas(q[..., :16], kv, ctx_lens, node_mask, scale=0.2, v_dim=16,
                                                 config=cfg, poison=True, q_rope=q[..., 16:])
        ref = mla_attention_reference(q, kv, ctx_lens, node_mask, scale=0.2, v_dim=16)
        assert_close(out, ref, TOL[jnp.float32], f"pallas q_rope {cfg.name} splits {cfg.num_splits}")


def test_rope_part_bad_shapes():
    q, kv = jnp.zeros((1, 3, 2, 8)), jnp.zeros((1, 10, 12))
    lens, mask = jnp.zeros((1,), jnp.int32), jnp.zeros((1, 3, 1), jnp.int32)
    with pytest.raises(ValueError, match="latent part"):
        mla_attention(q, kv, lens, mask, scale=1.0, v_dim=4, q_rope=jnp.zeros((1, 3, 2, 4)))
    with pytest.raises(ValueError, match="q_rope must be"):
        mla_attention(q, kv, lens, mask, scale=1.0, v_dim=8, q_rope=jnp.zeros((1, 3, 1, 4)))
    with pytest.raises(ValueError, match="q_rope must be"):
        mla_attention(q, kv, lens, mask, scale=1.0, v_dim=8, q_rope=jnp.zeros((1, 3, 2, 4), jnp.bfloat16))
    with pytest.raises(ValueError, match="kv must be"):
        mla_attention(q, kv, lens, mask, scale=1.0, v_dim=8, q_rope=jnp.zeros((1, 3, 2, 2)))


def test_pallas_heads_first_poisoned_splits():
    """heads_first through several context splits (the XLA combine) into NaN-poisoned buffers."""
    q, kv, ctx_lens, node_mask, _ = make_case(2, 37, 3, 24, 16, 120, [83, 5], ["bushy", "chain"],
                                              jnp.float32)
    cfg = pallas_triton.BlockConfig(block_m=16, block_n=16, num_warps=4, num_splits=3)
    out = pallas_triton.mla_attention_pallas(q.swapaxes(1, 2), kv, ctx_lens, node_mask, scale=0.2,
                                             v_dim=16, config=cfg, poison=True, heads_first=True)
    ref = mla_attention_reference(q, kv, ctx_lens, node_mask, scale=0.2, v_dim=16)
    assert_close(out.swapaxes(1, 2), ref, TOL[jnp.float32], "pallas heads_first splits")


def test_heads_first_bad_shape():
    q = jnp.zeros((1, 4, 3, 8))   # [S, H, Q, Dk]: Q = 3
    kv, lens = jnp.zeros((1, 10, 8)), jnp.zeros((1,), jnp.int32)
    with pytest.raises(ValueError, match="node_mask"):
        mla_attention(q, kv, lens, jnp.zeros((1, 4, 1), jnp.int32), scale=1.0, v_dim=4,
                      heads_first=True)    # a mask for Q = 4: the layout reads Q from axis 2
    with pytest.raises(ValueError, match=r"\[S, H, Q, Dk\]"):
        mla_attention(q[0], kv, lens, jnp.zeros((1, 3, 1), jnp.int32), scale=1.0, v_dim=4,
                      heads_first=True)


@pytest.mark.parametrize("config", [
    pallas_triton.BlockConfig(block_m=16, block_n=16, num_warps=4, num_splits=1),
    pallas_triton.BlockConfig(block_m=8, block_n=16, num_warps=4, num_splits=3),
], ids=["one_split", "three_splits"])
def test_pallas_poisoned_blocks_and_splits(config):
    """Rows (Q*H = 30) and contexts not multiples of the blocks; NaN-filled outputs must be overwritten."""
    q, kv, ctx_lens, node_mask, vis = make_case(3, 10, 3, 40, 32, 90, [0, 41, 80],
                                                ["chain", "random", "star"], jnp.float32)
    vis[0, 4] = False                                   # ctx 0 and no visible token: zero row
    node_mask = visibility_to_mask(vis)
    out = pallas_triton.mla_attention_pallas(q, kv, ctx_lens, node_mask, scale=0.2, v_dim=32,
                                             config=config, poison=True)
    ref = mla_attention_reference(q, kv, ctx_lens, node_mask, scale=0.2, v_dim=32)
    assert_close(out, ref, 1e-5, "pallas_triton")
    assert np.all(np.asarray(out)[0, 4] == 0)


def test_xla_many_chunks_under_jit(monkeypatch):
    """Force 16-slot chunks (last one overlapping) and trace ctx_lens, as the model does."""
    monkeypatch.setattr(xla, "_SCORE_ELEMS", 1)
    q, kv, ctx_lens, node_mask, _ = make_case(2, 6, 2, 24, 16, 53, [47, 30], ["bushy"], jnp.float32)
    fn = jax.jit(lambda *a: mla_attention(*a, scale=0.3, v_dim=16, impl="xla"))
    out = fn(q, kv, ctx_lens, node_mask)
    ref = mla_attention_reference(q, kv, ctx_lens, node_mask, scale=0.3, v_dim=16)
    assert_close(out, ref, 1e-5, "xla chunked")


@pytest.mark.parametrize("num_q", [1, 32, 70])
def test_mask_round_trip(num_q):
    vis = fresh_rng().random((2, num_q, num_q)) < 0.5
    node_mask = visibility_to_mask(vis)
    assert node_mask.shape == (2, num_q, -(-num_q // 32)) and node_mask.dtype == jnp.int32
    np.testing.assert_array_equal(visibility_from_mask_reference(np.asarray(node_mask), num_q), vis)
    np.testing.assert_array_equal(mask_to_visibility(node_mask, num_q), vis)


def test_mask_bit_layout():
    vis = np.zeros((1, 33, 33), bool)
    vis[0, 0, 31] = vis[0, 1, 0] = vis[0, 2, 32] = True
    node_mask = np.asarray(visibility_to_mask(vis))
    assert node_mask[0, 0, 0] == np.iinfo(np.int32).min and node_mask[0, 1, 0] == 1
    assert node_mask[0, 2, 0] == 0 and node_mask[0, 2, 1] == 1


def _bad(**kw):
    q, kv, ctx_lens, node_mask, _ = make_case(2, 3, 2, 24, 16, 10, [4, 7], ["chain"], jnp.float32)
    args = dict(q=q, kv=kv, ctx_lens=ctx_lens, node_mask=node_mask, scale=0.1, v_dim=16) | kw
    return args


@pytest.mark.parametrize("kw,match", [
    (dict(q=jnp.zeros((2, 3, 24))), "q must be"),
    (dict(kv=jnp.zeros((2, 10, 20))), "kv must be"),
    (dict(kv=jnp.zeros((2, 2, 24))), "fewer than the Q"),
    (dict(ctx_lens=jnp.zeros((3,), jnp.int32)), "ctx_lens must be integer"),
    (dict(ctx_lens=jnp.array([4, 8], jnp.int32)), "ctx_lens \\+ Q"),
    (dict(node_mask=jnp.zeros((2, 3, 2), jnp.int32)), "node_mask must be"),
    (dict(v_dim=25), "v_dim must be"),
    (dict(scale=float("nan")), "scale must be"),
])
def test_bad_input(kw, match):
    args = _bad(**kw)
    with pytest.raises(ValueError, match=match):
        mla_attention(args.pop("q"), args.pop("kv"), args.pop("ctx_lens"), args.pop("node_mask"), **args)


def test_pallas_rejects_non_pow2_split():
    args = _bad()
    with pytest.raises(ValueError, match="power-of-two"):
        mla_attention(args["q"], args["kv"], args["ctx_lens"], args["node_mask"], scale=0.1, v_dim=12,
                      impl="pallas_triton")


@pytest.mark.parametrize("num_splits", [1, None])
def test_pallas_k2_layout_two_words(num_splits):
    """Kimi-K2 widths (Dk 512 + 64), Q = 37 (two mask words), bf16, ctx 0 and off-block, poisoned."""
    q, kv, ctx_lens, node_mask, _ = make_case(2, 37, 2, 576, 512, 120, [0, 70], ["bushy", "star"],
                                              jnp.bfloat16)
    config = pallas_triton.BlockConfig(block_m=32, block_n=32, num_splits=num_splits)
    out = pallas_triton.mla_attention_pallas(q, kv, ctx_lens, node_mask, scale=576 ** -0.5, v_dim=512,
                                             config=config, poison=True)
    assert out.shape == (2, 37, 2, 512) and out.dtype == jnp.bfloat16
    ref = mla_attention_reference(q, kv, ctx_lens, node_mask, scale=576 ** -0.5, v_dim=512)
    assert_close(out, ref, TOL[jnp.bfloat16], f"pallas splits={num_splits}")


def test_block_config_parse():
    cfg = pallas_triton.BlockConfig.parse("64x32x4x2")
    assert cfg == pallas_triton.BlockConfig(block_m=64, block_n=32, num_warps=4, num_stages=2)
    assert cfg.name == "64x32x4x2" and pallas_triton.BlockConfig.parse("32x64x4x2") == pallas_triton.BlockConfig()
    capped = pallas_triton.BlockConfig.parse("64x64x8x2s9")      # context splits given
    assert capped.num_splits == 9 and capped.name == "64x64x8x2s9"
    for bad in ("64x32x4x2v2", "64x32x4x2s0", "64x32x4x2s", "64x32x4s2"):   # no v_split field
        with pytest.raises(ValueError, match="BMxBNxWARPSxSTAGES"):
            pallas_triton.BlockConfig.parse(bad)


# Two-pass path (two_pass.py): a scores GEMM writing P, m, l, then a P @ V GEMM.
TWO_PASS_SMALL = [two_pass.TwoPassConfig(32, 32, 4, 2, 16, 16, 16, 4, 2),     # 32-wide tiles: a word each
                  two_pass.TwoPassConfig(16, 64, 4, 2, 32, 32, 32, 4, 2)]     # 64-wide: two words per tile


@pytest.mark.parametrize("config", TWO_PASS_SMALL, ids=lambda c: c.name)
@pytest.mark.parametrize("num_q", [10, 37, 70])
def test_two_pass_poisoned(config, num_q):
    """Ragged ctx incl. 0 and off the tiles, Q spanning 1-3 mask words (1-3 tree tiles), a row that
    sees nothing; NaN-poisoned P, m, l and output; both layouts and the rope part given apart."""
    q, kv, ctx_lens, node_mask, vis = make_case(3, num_q, 3, 40, 32, 200, [0, 41, 200 - num_q],
                                                ["bushy", "random", "chain"], jnp.float32)
    vis[0, num_q // 2] = False          # stream 0 has no context: this row sees nothing
    node_mask = visibility_to_mask(vis)
    ref = mla_attention_reference(q, kv, ctx_lens, node_mask, scale=0.2, v_dim=32)
    for heads_first, rope_apart in [(False, False), (True, True)]:
        lay = (lambda a: a.swapaxes(1, 2)) if heads_first else (lambda a: a)
        qq, qr = (lay(q[..., :32]), lay(q[..., 32:])) if rope_apart else (lay(q), None)
        out = pallas_triton.mla_attention_pallas(qq, kv, ctx_lens, node_mask, scale=0.2, v_dim=32, config=config,
                                                 poison=True, heads_first=heads_first, q_rope=qr)
        assert_close(lay(out), ref, 1e-5, f"two-pass {config.name} heads_first={heads_first}")
        assert np.all(np.asarray(lay(out))[0, num_q // 2] == 0)


def test_two_pass_k2_widths_bf16():
    """Kimi-K2 widths (Dk 512 + 64, the rope part inside the one Dk loop), the default tiles, bf16,
    Q = 37, ctx 0 and off the tiles, poisoned."""
    q, kv, ctx_lens, node_mask, _ = make_case(2, 37, 2, 576, 512, 300, [0, 170], ["bushy", "star"],
                                              jnp.bfloat16)
    out = pallas_triton.mla_attention_pallas(q, kv, ctx_lens, node_mask, scale=576 ** -0.5, v_dim=512,
                                             config=two_pass.TwoPassConfig(), poison=True)
    assert out.shape == (2, 37, 2, 512) and out.dtype == jnp.bfloat16
    ref = mla_attention_reference(q, kv, ctx_lens, node_mask, scale=576 ** -0.5, v_dim=512)
    assert_close(out, ref, TOL[jnp.bfloat16], "two-pass k2 widths")
    apart = pallas_triton.mla_attention_pallas(q[..., :512], kv, ctx_lens, node_mask, scale=576 ** -0.5,
                                               v_dim=512, config=two_pass.TwoPassConfig(), poison=True,
                                               q_rope=q[..., 512:])
    np.testing.assert_array_equal(np.asarray(apart), np.asarray(out))   # rejoined: the same loop


def test_two_pass_context_splits_and_stream_groups(monkeypatch):
    """P @ V split over the context (float32 partials added) and streams run in groups (a P budget
    of one stream): both equal the golden, poisoned."""
    q, kv, ctx_lens, node_mask, _ = make_case(3, 12, 2, 40, 32, 400, [388, 0, 77], ["bushy", "chain", "star"],
                                              jnp.float32)
    ref = mla_attention_reference(q, kv, ctx_lens, node_mask, scale=0.2, v_dim=32)
    cfg = TWO_PASS_SMALL[0]
    assert two_pass.pv_splits(3, 24, 32, 400, 12, cfg) > 1            # few programs: the context is split
    monkeypatch.setattr(two_pass, "_P_BYTES", 1)                      # one stream per group
    out = pallas_triton.mla_attention_pallas(q, kv, ctx_lens, node_mask, scale=0.2, v_dim=32, config=cfg,
                                             poison=True)
    assert_close(out, ref, 1e-5, "two-pass splits and groups")
    monkeypatch.setattr(two_pass, "pv_splits", lambda *a: 1)
    out = pallas_triton.mla_attention_pallas(q, kv, ctx_lens, node_mask, scale=0.21, v_dim=32, config=cfg,
                                             poison=True)
    ref = mla_attention_reference(q, kv, ctx_lens, node_mask, scale=0.21, v_dim=32)
    assert_close(out, ref, 1e-5, "two-pass, one split")


def test_select_config_picks_two_pass_for_k2_shapes(monkeypatch, request):
    """>= 256 rows at K2 widths from 1024 slots: two-pass; plain decode, narrow latents: one-pass;
    the registered implementation follows it (here 32 nodes x 8 heads over 1100 slots: the
    two-pass GEMMs are traced, counted by a wrapper, and equal the golden)."""
    assert pallas_triton.select_config(64 * 16, 8208, 512) == two_pass.TwoPassConfig()
    assert pallas_triton.select_config(64 * 4, 8196, 512) == two_pass.TwoPassConfig()             # one stream
    assert pallas_triton.select_config(64 * 4, 8196, 512, 8) == two_pass.TwoPassConfig()
    assert pallas_triton.select_config(64, 8193, 512, 8) == pallas_triton.BlockConfig()            # Q = 1
    wide = pallas_triton.BlockConfig(block_m=64, block_n=64, num_warps=8, num_stages=2)
    assert pallas_triton.select_config(64, 8193, 512, 16) == wide                                   # many slots
    assert pallas_triton.select_config(64, 32769, 512, 8) == wide
    assert isinstance(pallas_triton.select_config(65 * 4, 2048, 64), pallas_triton.BlockConfig)     # small pair
    assert pallas_triton.select_config(64 * 16, 8208, 512, rope=8) == pallas_triton.BlockConfig()   # bf16 rope < 16
    assert pallas_triton.select_config(64 * 16, 8208, 512, rope=8, dtype=jnp.float32) == two_pass.TwoPassConfig()
    assert isinstance(pallas_triton.select_config(1024, 500, 512), pallas_triton.BlockConfig)
    calls, two = [], pallas_triton.mla_attention_two_pass
    monkeypatch.setattr(pallas_triton, "mla_attention_two_pass", lambda *a, **k: calls.append(1) or two(*a, **k))
    jax.clear_caches()                                 # traced here, through the counting wrapper
    request.addfinalizer(jax.clear_caches)             # and no trace of it outlives the test
    q, kv, ctx_lens, node_mask, _ = make_case(1, 32, 8, 576, 512, 1100, [1060], ["bushy"], jnp.bfloat16)
    out = mla_attention(q, kv, ctx_lens, node_mask, scale=576 ** -0.5, v_dim=512, impl="pallas_triton")
    assert calls, "pallas_triton did not take the two-pass GEMMs"
    ref = mla_attention_reference(q, kv, ctx_lens, node_mask, scale=576 ** -0.5, v_dim=512)
    assert_close(out, ref, TOL[jnp.bfloat16], "pallas_triton auto (two-pass)")


def test_two_pass_config_parse_and_checks():
    cfg = pallas_triton.parse_config("tp128x64x4x3-64x256x32x8x2")
    assert cfg == two_pass.TwoPassConfig(128, 64, 4, 3, 64, 256, 32, 8, 2) and cfg.name == "tp128x64x4x3-64x256x32x8x2"
    assert pallas_triton.parse_config(two_pass.TwoPassConfig().name) == two_pass.TwoPassConfig()
    assert pallas_triton.parse_config("32x64x4x2") == pallas_triton.BlockConfig()
    for bad in ("tp128x64x4x3", "tp128x64x4x3-64x256x32x8x2be"):      # no b / e options (always on)
        with pytest.raises(ValueError, match="tpMxNxWxS-MxVxKxWxS"):
            pallas_triton.parse_config(bad)
    q, kv, ctx_lens, node_mask, _ = make_case(1, 3, 2, 24, 16, 40, [10], ["chain"], jnp.float32)
    for bad, match in [(dict(score_n=16), "score_n must be >= 32"), (dict(score_m=48), "score_m must be a power"),
                       (dict(score_n=32, pv_k=64), "pv_k=64 must divide score_n=32")]:
        with pytest.raises(ValueError, match=match):
            pallas_triton.mla_attention_pallas(q, kv, ctx_lens, node_mask, scale=0.1, v_dim=16,
                                               config=dataclasses.replace(two_pass.TwoPassConfig(), **bad))


GPU_CASES = [  # (id, S, Q, H, N, ctx, config): K2 widths (Dk 512 + 64), bf16
    (1, 3, 1, 64, 9000, [8999, 0, 4097], None),                                   # decode: one-pass, splits
    (7, 16, 1, 64, 9000, [8999, 0, 4097] + [8000] * 13, None),                    # decode: 64-row tiles
    (2, 2, 37, 8, 3000, [2000, 0], pallas_triton.BlockConfig()),
    (3, 2, 37, 8, 3000, [2000, 0], pallas_triton.BlockConfig(num_splits=1)),
    (4, 2, 65, 8, 3000, [2900, 17], None),                                        # select_config: two-pass
    (5, 1, 16, 64, 8300, [8192], None),                                           # two-pass, P @ V split
    (6, 2, 70, 4, 1500, [0, 1400], two_pass.TwoPassConfig(128, 64, 4, 3, 128, 256, 64, 8, 3)),
]


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="compiled kernels at K2 sizes: GPU only")
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: f"case{c[0]}")
def test_gpu_k2_shapes(case):
    """Both paths compiled (not interpreted) at K2 widths and real context lengths, both layouts,
    NaN-poisoned, against the float64 golden (on an H200: rel err 1.2e-4 to 2.6e-3)."""
    cid, num_s, num_q, num_h, n, ctx, config = case
    q, kv, ctx_lens, node_mask, _ = make_case(num_s, num_q, num_h, 576, 512, n, ctx, ["bushy", "chain"],
                                              jnp.bfloat16)
    ref = mla_attention_reference(q, kv, ctx_lens, node_mask, scale=576 ** -0.5, v_dim=512)
    for heads_first in (False, True):
        lay = (lambda a: a.swapaxes(1, 2)) if heads_first else (lambda a: a)
        out = pallas_triton.mla_attention_pallas(lay(q), kv, ctx_lens, node_mask, scale=576 ** -0.5, v_dim=512,
                                                 config=config, poison=True, heads_first=heads_first)
        assert_close(lay(out), ref, TOL[jnp.bfloat16], f"case {cid} heads_first={heads_first}")


MOSAIC_CASES = [  # (id, S, Q, H, Dk, v_dim, N, ctx, heads_first, rope apart): around the 128-key pairs
    (21, 3, 5, 4, 64, 32, 300, [0, 127, 128], False, False),
    (22, 2, 37, 3, 64, 32, 429, [256, 389], True, False),      # two mask words, N % 8 != 0
    (23, 4, 1, 8, 64, 32, 260, [255, 129, 0, 1], False, True),
    (24, 1, 9, 2, 128, 64, 700, [640], True, True),
    (26, 2, 17, 8, 64, 32, 300, [130, 0], False, False),      # 136 rows: no copy, a partial last block
]


@pytest.mark.parametrize("impl", ["xla", "pallas_triton"])
def test_balance_hint_changes_nothing_where_nothing_is_scheduled(impl):
    """mla_attention(balance=True) on the implementations that have no schedule to balance: the
    same output, bit for bit, as without the hint (ragged contexts, one stream empty)."""
    q, kv, ctx_lens, node_mask, _ = make_case(3, 5, 4, 64, 32, 300, [0, 250, 40], ["bushy", "chain", "star"],
                                              jnp.float32)
    out = [np.asarray(mla_attention(q, kv, ctx_lens, node_mask, scale=0.2, v_dim=32, impl=impl, balance=b))
           for b in (False, True)]
    np.testing.assert_array_equal(*out)


@pytest.mark.parametrize("case", MOSAIC_CASES, ids=lambda c: f"case{c[0]}")
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("splits,merge,balance", [(None, "pallas", False), (3, "xla", False), (3, "pallas", False),
                                                  (18, "pallas", False), (1, "pallas", True)])
def test_mosaic_parts_around_the_kernel(case, dtype, splits, merge, balance):
    """mosaic_gpu's XLA work around the kernel (`prepare`: query rows and the tail's mask words),
    with the kernel replaced by its XLA twin: equals the golden; splits=3: each stream's pairs
    split into 3 runs (some empty) merged by combine_splits or by the Pallas merge kernel ("rows"
    form), 18 runs (most empty) by its "parts" form; None: split_count's runs; balance (the
    next test's cases): the runs shared out by the streams' pairs (runs.run_schedule), or with
    one run per stream the streams launched longest first (the twin computes every stream)."""
    cid, num_s, num_q, num_h, dk, v_dim, n, ctx, heads_first, apart = case
    q, kv, ctx_lens, node_mask, _ = make_case(num_s, num_q, num_h, dk, v_dim, n, ctx,
                                              ["bushy", "chain", "star"], dtype)
    lay = (lambda a: a.swapaxes(1, 2)) if heads_first else (lambda a: a)
    kw = dict(q_rope=lay(q[..., v_dim:])) if apart else {}
    qq = lay(q[..., :v_dim]) if apart else lay(q)
    out = mosaic_gpu.mla_attention_mosaic(qq, kv, ctx_lens, node_mask, scale=0.2, v_dim=v_dim,
                                          heads_first=heads_first, context=mosaic_gpu.context_attention_xla,
                                          splits=splits, merge=merge, balance=balance, **kw)
    assert out.dtype == dtype
    ref = mla_attention_reference(q, kv, ctx_lens, node_mask, scale=0.2, v_dim=v_dim)
    assert_close(lay(out), ref, TOL[dtype], f"mosaic parts case {cid}")


@pytest.mark.parametrize("case", MOSAIC_CASES, ids=lambda c: f"case{c[0]}")
@pytest.mark.parametrize("splits,merge", [(3, "xla"), (3, "pallas"), (18, "pallas")])
def test_mosaic_parts_balanced(case, splits, merge):
    """test_mosaic_parts_around_the_kernel with balance=True (bf16): S * splits runs shared out
    by the streams' pairs (ragged contexts: a long stream takes most), merged per stream."""
    test_mosaic_parts_around_the_kernel(case, jnp.bfloat16, splits, merge, True)


def test_mosaic_parts_balanced_one_wave():
    """balance=True where the row blocks fill one wave (2 streams x 37 row blocks of H 64): launch
    takes 2 runs per stream, shared out by the streams' pairs, merged (bf16, XLA twin)."""
    case = (25, 2, 37, 64, 64, 32, 429, [100, 389], True, False)
    q_pad = jax.ShapeDtypeStruct((2, 37 * 64, 64), jnp.bfloat16)
    assert mosaic_gpu.launch(q_pad, jax.ShapeDtypeStruct((2, 432, 64), jnp.bfloat16), balance=True)[1] == 2
    test_mosaic_parts_around_the_kernel(case, jnp.bfloat16, None, "pallas", True)


@pytest.mark.parametrize("hopper,shape,slots,dtype,want", [
    (True, (16, 16, 64), 9000, jnp.bfloat16, "mosaic_gpu"),     # 256 CTAs
    (True, (1, 65, 64), 9000, jnp.bfloat16, "mosaic_gpu"),      # 65 CTAs: the context is split
    (True, (16, 1, 64), 32776, jnp.bfloat16, "mosaic_gpu"),     # plain decode: 16 CTAs, split
    (True, (16, 16, 64), 1032, jnp.bfloat16, "mosaic_gpu"),     # a short cache, 256 CTAs
    (True, (1, 64, 64), 1032, jnp.bfloat16, "pallas_triton"),   # a short cache, 64 CTAs
    (True, (8, 16, 64), 2056, jnp.bfloat16, "mosaic_gpu"),      # 128 CTAs
    (True, (16, 16, 64), 9000, jnp.float32, "pallas_triton"),   # the kernel takes bf16/f16 only
    (False, (16, 16, 64), 9000, jnp.bfloat16, "pallas_triton"),  # not Hopper
])
def test_mosaic_auto_choice(monkeypatch, hopper, shape, slots, dtype, want):
    """impl="auto" for mla_attention on a GPU: the shape rule (mosaic_gpu.choose), then the
    registry's fallback where the kernel refuses the call (mosaic_gpu.supports)."""
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(mosaic_gpu, "is_hopper", lambda: hopper)
    num_s, num_q, num_h = shape
    q = jax.ShapeDtypeStruct((num_s, num_h, num_q, 512), dtype)
    rope = jax.ShapeDtypeStruct((num_s, num_h, num_q, 64), dtype)
    kv = jax.ShapeDtypeStruct((num_s, slots, 576), dtype)
    got = registry.auto_impl("mla_attention", q, kv, None, None, scale=0.1, v_dim=512, heads_first=True,
                             q_rope=rope)
    assert got == want


def test_mosaic_split_count():
    """Runs per stream (S streams, row blocks, cache slots): none while the row blocks fill the
    132 SMs, else as many as one wave of 132 CTAs holds, each of at least one pair (128 keys) of
    the cache; where the wave model's estimate is 10% lower (CTAs just past a wave, or a wave well
    short of full), the fewest runs estimated within 3% of its lowest."""
    assert mosaic_gpu.split_count(1, 132, 1 << 20) == 1 and mosaic_gpu.split_count(16, 256, 1 << 20) == 1
    assert mosaic_gpu.split_count(16, 1, 32776) == 8        # 128 CTAs; 9 would start a second wave
    assert mosaic_gpu.split_count(1, 64, 32776) == 2
    assert mosaic_gpu.split_count(1, 100, 32776) == 5       # 2 runs: two waves for 1.5 waves of work; 5: 3.8 in 4
    assert mosaic_gpu.split_count(8, 1, 32776) == 16
    assert mosaic_gpu.split_count(1, 1, 8200) == 65         # 8192 + 1 keys: 64 whole pairs + 1 tail pair
    assert mosaic_gpu.split_count(1, 1, 32776) == 132       # one wave
    assert mosaic_gpu.split_count(4, 1, 300) == 3           # two whole pairs and a tail pair
    assert mosaic_gpu.split_count(4, 1, 100) == 1
    # the goal shapes keep the one-wave rule: Q 16 / 64 / 256 at S 1 / 8 / 16, ctx 8k and 32k
    for ctx in (8192, 32768):
        for q in (16, 64, 256):
            for s in (1, 8, 16):
                want = 1 if s * q >= 132 else 132 // (s * q)
                assert mosaic_gpu.split_count(s, q, ctx + q + 7) == want, (ctx, q, s)
    # past a wave: 16k Q 17 (H 64: 17 row blocks) S 8 is 136 CTAs, two waves for 1.03 waves of
    # work; S 16 is 272 (three for 2.06); 8k Q 9 S 8 is 72, a wave half full
    picks = {(8, 17, 16408): 5, (16, 17, 16408): 3, (8, 17, 32792): 6, (16, 17, 32792): 5, (8, 9, 8208): 5,
             (16, 9, 8208): 5}
    for (s, blocks, slots), want in picks.items():
        assert mosaic_gpu.split_count(s, blocks, slots) == want, (s, blocks, slots)
        est = functools.partial(mosaic_gpu.split_estimate_us, s * blocks, -(-slots // 128))
        lowest = min(est(k) for k in range(1, -(-slots // 128) + 1))
        assert est(want) <= mosaic_gpu.WAVE_TIE * lowest and all(
            est(k) > mosaic_gpu.WAVE_TIE * lowest for k in range(1, want))
    est = functools.partial(mosaic_gpu.split_estimate_us, 136, 129)
    assert est(5) < 0.9 * est(1) and est(1) == 2 * (mosaic_gpu.CTA_US + 129 * mosaic_gpu.PAIR_US)


@pytest.mark.parametrize("num_s,num_q,slots,balance,want", [
    (8, 16, 16392, False, (2, 1)),     # 128 CTAs, one wave: unsplit
    (8, 16, 16392, True, (2, 2)),      # ... with balance two runs per stream, shared out by pairs
    (1, 128, 16392, True, (2, 1)),     # one stream: nothing to balance
    (16, 16, 16392, True, (2, 1)),     # 256 CTAs: unsplit, launched longest stream first
    (2, 32, 16392, True, (2, 2)),      # 64 CTAs: split_count's 2 runs either way
    (16, 1, 8200, True, (1, 8)),       # decode: split_count's runs
    (8, 16, 128, True, (2, 1)),        # a one-pair cache: nothing to split
    (8, 17, 16408, False, (1, 5)),     # 136 CTAs, just past one wave: the wave model's 5 runs
    (8, 17, 16408, True, (1, 5)),      # ... the same with balance (launched longest run first)
])
def test_mosaic_launch(num_s, num_q, slots, balance, want):
    """launch: (cluster, runs per stream) from prepare's shapes (H 64: Q row blocks per stream)."""
    q_pad = jax.ShapeDtypeStruct((num_s, max(64, 64 * num_q), 576), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((num_s, slots, 576), jnp.bfloat16)
    assert mosaic_gpu.launch(q_pad, kv, balance=balance) == want
    assert mosaic_gpu.launch(q_pad, kv, splits=3, balance=balance)[1] == 3


@pytest.mark.parametrize("num_q", [1, 5, 32, 33, 64, 100, 129])
def test_mosaic_tail_words_match_golden(num_q):
    """tail_words against the bits written key by key from their definition: ones for the tail's
    context keys, then node_mask's first Q bits (its bits past Q are random and must be ignored);
    contexts of 0, whole pairs, a pair minus one key, random."""
    rng = fresh_rng()
    ctx = np.array([0, 128 * rng.integers(1, 9), 128 * rng.integers(1, 9) - 1, rng.integers(1, 3000)], np.int32)
    words = -(-num_q // 32)
    node_mask = rng.integers(0, 2 ** 32, (4, num_q, words), dtype=np.uint64).astype(np.uint32)
    pairs = ctx // mosaic_gpu.PAIR
    got = mosaic_gpu.tail_words(jnp.asarray(ctx), jnp.asarray(node_mask.view(np.int32)), num_q)
    got_pairs, tail_tiles = mosaic_gpu.tail_counts(jnp.asarray(ctx), num_q)
    np.testing.assert_array_equal(got_pairs, pairs)
    got = np.asarray(got).view(np.uint32)
    num_words = 4 * -(-(mosaic_gpu.PAIR - 1 + num_q) // mosaic_gpu.PAIR)
    assert got.shape == (4, num_q, num_words)
    for s in range(4):
        c = ctx[s] - mosaic_gpu.PAIR * pairs[s]
        assert tail_tiles[s] == -(-(c + num_q) // mosaic_gpu.BLOCK_K)
        for node in range(num_q):
            for t in range(32 * num_words):
                u = t - c
                want = u < 0 or (u < num_q and (node_mask[s, node, u // 32] >> (u % 32)) & 1 == 1)
                assert ((got[s, node, t // 32] >> (t % 32)) & 1 == 1) == want, (s, node, t)


def test_mosaic_supported_says_why():
    assert mosaic_gpu.supported(576, 512, jnp.bfloat16) is None
    assert "dtype" in mosaic_gpu.supported(576, 512, jnp.float32)
    assert "v_dim % 128" in mosaic_gpu.supported(576, 500, jnp.bfloat16)
    assert "too wide" in mosaic_gpu.supported(640, 512, jnp.bfloat16)


@pytest.mark.parametrize("splits,rows", [(1, 128), (3, 128), (3, 1024), (1, 136), (3, 200)])
def test_mosaic_kernel_lowers_with_balanced_runs(splits, rows):
    """context_attention(balance=True) lowers for CUDA on the CPU, clusters of one and two (where
    the row blocks pair up), with and without the timeline: splits 3, the schedule's scalar code
    in the kernel (at 1024 rows its 144 CTAs exceed one wave: launched by their runs' pairs, the
    order an input); splits 1, the streams launched longest first (the order an input, the grid's
    stream axis the slow one); 136 and 200 rows: a partial last row block."""
    blocks = -(-rows // 64)
    q = jax.ShapeDtypeStruct((3, rows, 576), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((3, 1024, 576), jnp.bfloat16)
    lens, bits = jax.ShapeDtypeStruct((3,), jnp.int32), jax.ShapeDtypeStruct((3, 4, 64 * blocks), jnp.int32)
    for cluster, timeline in itertools.product((1, 2) if blocks % 2 == 0 else (1,), (False, True)):
        run = functools.partial(mosaic_gpu.context_attention, num_q=5, scale=0.1, v_dim=512, cluster=cluster,
                                splits=splits, balance=True, timeline=timeline)
        jax.jit(run).trace(q, kv, lens, bits).lower(lowering_platforms=("cuda",))


def test_mosaic_context_bad_arguments():
    """context_attention names the argument it cannot take: the epilogue, rows off a multiple of 8
    or in half a cluster, tail_bits not rounded up to 64 rows, the registers epilogue (unclipped
    stores) with a partial row block."""
    kv = jnp.zeros((1, 256, 576), jnp.bfloat16)
    lens = jnp.ones(1, jnp.int32)

    def call(rows, bit_rows, **kw):
        mosaic_gpu.context_attention(jnp.zeros((1, rows, 576), jnp.bfloat16), kv, lens,
                                     jnp.zeros((1, 4, bit_rows), jnp.int32), num_q=1, scale=0.1, v_dim=512, **kw)

    with pytest.raises(ValueError, match="epilogue must be one of"):
        call(64, 64, epilogue="smem")
    with pytest.raises(ValueError, match="rows=68 must be a multiple of 8"):
        call(68, 128)
    with pytest.raises(ValueError, match="rows=136 must be .* clusters of 2"):
        call(136, 192, cluster=2)
    with pytest.raises(ValueError, match=r"tail_bits must be \[S=1, 4k, 192\]"):
        call(136, 136)
    with pytest.raises(ValueError, match="registers epilogue needs rows=136"):
        call(136, 192, epilogue="registers")
    with pytest.raises(ValueError, match=r"decode form\) must be \[S=1\] with num_q=1; got \(1,\) with num_q=2"):
        mosaic_gpu.context_attention(jnp.zeros((1, 64, 576), jnp.bfloat16), kv, lens, jnp.zeros(1, jnp.int32),
                                     num_q=2, scale=0.1, v_dim=512)


DECODE_CTX = [0, 1, 63, 64, 127, 128, 200, 1023]   # the node's key at every kind of tail position


def decode_case(rng, rows: int, num_slots: int):
    """Inputs of a decode-form context_attention call (Q 1) over DECODE_CTX: the node's mask word
    with bit 0 set in the odd streams only (a node that does not see itself must see only its
    context) and random higher bits (not tree tokens: ignored)."""
    num_s = len(DECODE_CTX)
    word = rng.integers(0, 2 ** 31, num_s).astype(np.int32) & ~1 | (np.arange(num_s) % 2).astype(np.int32)
    q = rng.standard_normal((num_s, rows, 576))
    kv = rng.standard_normal((num_s, num_slots, 576))
    return q, kv, jnp.asarray(DECODE_CTX, jnp.int32), jnp.asarray(word)


@pytest.mark.parametrize("splits,balance", [(1, False), (3, False), (3, True)])
def test_mosaic_decode_form_is_the_words_form(splits, balance):
    """context_attention's decode form (tail_bits [S], the node's mask word, num_q 1) in its XLA
    twin: the same O and lse as the per-row words tail_words makes from that word, and attention
    over exactly the context keys plus the node's own key (ctx_lens[s]) where bit 0 is set."""
    rng = fresh_rng()
    rows, n = 8, 1032
    q, kv, ctx_lens, word = decode_case(rng, rows, n)
    q, kv = jnp.asarray(q[..., :16], jnp.float32), jnp.asarray(kv[..., :16], jnp.float32)
    per_row = mosaic_gpu.decode_words(ctx_lens, word, rows)
    assert per_row.shape == (len(DECODE_CTX), 4, 64) and not np.asarray(per_row[..., rows:]).any()
    kw = dict(num_q=1, scale=0.3, v_dim=8, splits=splits, balance=balance)
    o, lse = mosaic_gpu.context_attention_xla(q, kv, ctx_lens, word, **kw)
    o_w, lse_w = mosaic_gpu.context_attention_xla(q, kv, ctx_lens, per_row, **kw)
    np.testing.assert_array_equal(np.asarray(o), np.asarray(o_w))
    np.testing.assert_array_equal(np.asarray(lse), np.asarray(lse_w))
    merged = (mosaic_gpu.combine_splits(o, lse, ctx_lens, num_q=1, balance=balance) if splits > 1 else o)
    for s, c in enumerate(DECODE_CTX):
        keys = np.arange(c + (s % 2))
        st = np.asarray(q[s], np.float64) @ np.asarray(kv[s, keys], np.float64).T * 0.3          # [R, keys]
        if not keys.size:
            assert not np.asarray(merged[s]).any(), s
            continue
        p = np.exp(st - st.max(axis=1, keepdims=True))
        want = p @ np.asarray(kv[s, keys, :8], np.float64) / p.sum(axis=1, keepdims=True)
        np.testing.assert_allclose(np.asarray(merged[s], np.float64), want, rtol=1e-4, atol=1e-5, err_msg=str(s))


@pytest.mark.parametrize("splits,balance,rows", [(1, False, 64), (8, False, 64), (3, True, 64), (5, False, 8)])
def test_mosaic_kernel_lowers_in_decode_form(splits, balance, rows):
    """The decode form (the tail's mask from the context length in the kernel) lowers for CUDA on
    the CPU: unsplit, split, split with balance (the schedule's stream), 8 rows (H 8: a partial
    row block)."""
    args = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in (
        ((4, rows, 576), jnp.bfloat16), ((4, 1024, 576), jnp.bfloat16), ((4,), jnp.int32), ((4,), jnp.int32))]
    run = functools.partial(mosaic_gpu.context_attention, num_q=1, scale=0.1, v_dim=512, splits=splits,
                            balance=balance)
    jax.jit(run).trace(*args).lower(lowering_platforms=("cuda",))


def test_mosaic_prepare_decode_form():
    """prepare at Q 1 hands the kernel the node's mask word [S] as it is: with a cache of a
    multiple of 8 slots its whole jaxpr is reshapes (no XLA kernel); above Q 1 the per-row words."""
    q, kv, ctx_lens, node_mask, _ = make_case(3, 1, 8, 64, 32, 304, [0, 130, 255], ["chain"], jnp.bfloat16)
    _, _, _, bits = mosaic_gpu.prepare(q, kv, ctx_lens, node_mask)
    np.testing.assert_array_equal(np.asarray(bits), np.asarray(node_mask).view(np.int32).reshape(3))
    jaxpr = jax.make_jaxpr(functools.partial(mosaic_gpu.prepare, q, kv, ctx_lens))(node_mask)
    assert {e.primitive.name for e in jaxpr.eqns} <= {"reshape", "bitcast_convert_type"}, jaxpr
    q2, kv2, ctx2, mask2, _ = make_case(3, 2, 8, 64, 32, 300, [0, 130, 255], ["chain"], jnp.bfloat16)
    assert mosaic_gpu.prepare(q2, kv2, ctx2, mask2)[3].shape == (3, 8, 64)    # 4 words per tail pair


def test_mosaic_prepare_pads_rows_to_8_only():
    """prepare: Q * H = 136 rows (8 heads, Q 17) go to the kernel as they are (no copy; the last
    64-row block is partial), 3 x 5 = 15 rows are padded to 16 with zeros; the tail bits always
    cover whole 64-row blocks, zero past Q * H; launch counts the partial block."""
    for num_q, num_h, aligned in ((17, 8, 136), (5, 3, 16)):
        q, kv, ctx_lens, node_mask, _ = make_case(2, num_q, num_h, 64, 32, 300, [130, 7], ["bushy", "chain"],
                                                  jnp.bfloat16)
        q_rows, _, _, bits = mosaic_gpu.prepare(q, kv, ctx_lens, node_mask)
        rows = num_q * num_h
        assert q_rows.shape == (2, aligned, 64) and bits.shape[2] == -(-rows // 64) * 64
        np.testing.assert_array_equal(np.asarray(q_rows[:, :rows]), np.asarray(q.reshape(2, rows, 64)))
        assert not np.asarray(q_rows[:, rows:]).any() and not np.asarray(bits[..., rows:]).any()
    q_rows = jax.ShapeDtypeStruct((8, 136, 576), jnp.bfloat16)
    assert mosaic_gpu.launch(q_rows, jax.ShapeDtypeStruct((8, 16392, 576), jnp.bfloat16), splits=1) == (1, 1)
    assert mosaic_gpu.cluster_size(200) == 2 and mosaic_gpu.cluster_size(136) == 1


@pytest.mark.skipif(mosaic_gpu.is_hopper(), reason="checks the refusal off a Hopper GPU")
def test_mosaic_refuses_without_gpu():
    q, kv, ctx_lens, node_mask, _ = make_case(1, 3, 64, 576, 512, 140, [130], ["chain"], jnp.bfloat16)
    with pytest.raises(ValueError, match="needs a Hopper GPU"):
        mla_attention(q, kv, ctx_lens, node_mask, scale=0.1, v_dim=512, impl="mosaic_gpu")


MOSAIC_GPU_CASES = [  # (id, S, Q, H, N, ctx): K2 widths, bf16
    (31, 2, 37, 64, 3000, [2000, 0]),            # 37 row blocks: no cluster; a stream with no pairs
    (32, 3, 16, 64, 8300, [8192, 130, 127]),     # clusters of two; N % 8 != 0 (padded copy)
    (33, 1, 4, 64, 9010, [8999]),
    (34, 2, 70, 4, 1500, [0, 1400]),             # 280 rows, padded to 320
    (35, 4, 40, 64, 2100, [2000, 1000, 0, 1500]),  # 160 CTAs: the context not split (the others are)
    (36, 3, 17, 8, 5000, [4096, 100, 2500]),     # 136 rows: a partial last row block, no copy
    (37, 4, 1, 64, 8300, [8192, 8255, 0, 8191]),  # plain decode (the kernel's decode form), split
]


@pytest.mark.gpu
@pytest.mark.skipif(not mosaic_gpu.is_hopper(), reason="Pallas Mosaic GPU kernel: Hopper GPU only")
@pytest.mark.parametrize("case", MOSAIC_GPU_CASES, ids=lambda c: f"case{c[0]}")
def test_gpu_mosaic_k2_shapes(case):
    """The compiled Mosaic GPU kernel at K2 widths and real contexts, both layouts and the rope part
    apart, against the float64 golden."""
    cid, num_s, num_q, num_h, n, ctx = case
    q, kv, ctx_lens, node_mask, _ = make_case(num_s, num_q, num_h, 576, 512, n, ctx, ["bushy", "chain"],
                                              jnp.bfloat16)
    ref = mla_attention_reference(q, kv, ctx_lens, node_mask, scale=576 ** -0.5, v_dim=512)
    for heads_first, apart in ((False, False), (True, False), (False, True)):
        lay = (lambda a: a.swapaxes(1, 2)) if heads_first else (lambda a: a)
        kw = dict(q_rope=lay(q[..., 512:])) if apart else {}
        out = mla_attention(lay(q[..., :512]) if apart else lay(q), kv, ctx_lens, node_mask, scale=576 ** -0.5,
                            v_dim=512, impl="mosaic_gpu", heads_first=heads_first, **kw)
        assert_close(lay(out), ref, TOL[jnp.bfloat16], f"case {cid} heads_first={heads_first} apart={apart}")


@pytest.mark.gpu
@pytest.mark.skipif(not mosaic_gpu.is_hopper(), reason="Pallas Mosaic GPU kernel: Hopper GPU only")
@pytest.mark.parametrize("case", [c for c in MOSAIC_GPU_CASES if c[1] > 1], ids=lambda c: f"case{c[0]}")
def test_gpu_mosaic_balanced(case):
    """mla_attention_mosaic(balance=True) at K2 widths against the float64 golden: case 31's 74
    row blocks fill one wave (2 runs per stream, shared out by pairs), cases 32 and 34 split by
    split_count under the schedule, case 35's 160 CTAs launch the longest stream first."""
    cid, num_s, num_q, num_h, n, ctx = case
    q, kv, ctx_lens, node_mask, _ = make_case(num_s, num_q, num_h, 576, 512, n, ctx, ["bushy", "chain"],
                                              jnp.bfloat16)
    ref = mla_attention_reference(q, kv, ctx_lens, node_mask, scale=576 ** -0.5, v_dim=512)
    out = jax.jit(functools.partial(mosaic_gpu.mla_attention_mosaic, scale=576 ** -0.5, v_dim=512, balance=True))(
        q, kv, ctx_lens, node_mask)
    assert_close(out, ref, TOL[jnp.bfloat16], f"case {cid} balanced")


def random_tail_bits(rng, pairs, num_words: int, rows: int, num_slots: int, empty) -> np.ndarray:
    """Random tail masks [S, W, R] int32 for context_attention: about half the bits set, none for
    keys at or past num_slots (the kernel's contract), none in the rows `empty` [S, R] marks."""
    t = np.arange(32 * num_words)
    ok = rng.random((len(pairs), 32 * num_words, rows)) < 0.5
    ok &= (mosaic_gpu.PAIR * np.asarray(pairs)[:, None] + t < num_slots)[..., None]
    ok &= ~empty[:, None, :]
    words = (ok.reshape(len(pairs), num_words, 32, rows).astype(np.uint64) << t[:32, None].astype(np.uint64)).sum(2)
    return words.astype(np.uint32).view(np.int32)


CONTEXT_CASES = [  # (rows, cluster, ctx_lens, Q, splits, epilogue): pairs 0-64, tail tiles 1-6
    (128, 2, [0, 130, 996, 8192], 70, 1, "tma"), (192, 1, [1, 191, 896, 8197], 1, 1, "tma"),
    (128, 2, [1023] * 4, 200, 1, "tma"), (192, 1, [0, 64, 127, 5], 1, 1, "tma"),
    (128, 2, [0, 130, 996, 8192], 70, 3, "tma"), (64, 1, [63, 256, 1216, 8192], 1, 5, "tma"),
    (64, 1, [0, 256, 1152, 8192], 1, 8, "tma"), (128, 2, [0, 130, 996, 8192], 70, 3, "registers"),
    (1024, 2, [0, 130, 996, 8192], 16, 3, "tma"),      # 192 CTAs: past one wave
    (136, 1, [0, 130, 996, 8192], 17, 1, "tma"), (136, 1, [1, 191, 896, 8197], 17, 3, "tma"),
    (200, 2, [0, 130, 996, 8192], 25, 1, "tma")]       # partial last row blocks


@pytest.mark.gpu
@pytest.mark.skipif(not mosaic_gpu.is_hopper(), reason="Pallas Mosaic GPU kernel: Hopper GPU only")
@pytest.mark.parametrize("rows,cluster,ctx,num_q,splits,epilogue,balance",
                         [c + (False,) for c in CONTEXT_CASES]
                         + [c + (True,) for c in CONTEXT_CASES if c[4] > 1 or len(set(c[2])) > 1])
def test_gpu_mosaic_context_kernel(rows, cluster, ctx, num_q, splits, epilogue, balance):
    """The kernel alone against its XLA twin: O and lse over 0 to 64 whole pairs and 1 to 6 tail
    tiles under random masks (odd counts end in half a pair, whose second tile's bits are set
    but must be ignored; stream 3's last tail tile reaches past the cache's 8200 slots; every
    other row of streams 0 and 2 has no tail key, so stream 0's rows with neither give zeros and
    -inf), every element (NaN-filled inputs run first, so buffers it fails to write would hold
    stale NaN; 136 and 200 rows end in a partial row block, whose missing rows TMA reads as zeros
    and must not write: not into the next stream's rows either); splits > 1: each run's part
    (balance: runs.run_schedule shares the 4 * splits CTAs out by the streams' pairs, with
    splits 3 here 1, 1, 2 and 8 runs), then merged; splits 1 with
    balance: the streams launched longest first (runs.stream_order), each output still at its
    own stream; split past one wave with balance: the CTAs launched longest run first
    (runs.part_order), each part still at its own place. Both epilogues."""
    ctx_lens = jnp.asarray(ctx, jnp.int32)
    counts = [c // mosaic_gpu.PAIR for c in ctx]
    rng = fresh_rng()
    q = jnp.asarray(rng.standard_normal((4, rows, 576)), jnp.bfloat16)
    kv = jnp.asarray(rng.standard_normal((4, 64 * 128 + 8, 576)), jnp.bfloat16)
    rows64 = -(-rows // 64) * 64        # a partial last row block: its bits past the rows are zero
    empty = np.zeros((4, rows64), bool)
    empty[[0, 2], ::2] = True
    empty[:, rows:] = True
    bits = jnp.asarray(random_tail_bits(rng, counts, 12, rows64, kv.shape[1], empty))
    run = jax.jit(lambda q, kv: mosaic_gpu.context_attention(q, kv, ctx_lens, bits, num_q=num_q, scale=0.04, v_dim=512,
                                                             cluster=cluster, splits=splits, epilogue=epilogue,
                                                             balance=balance))
    jax.block_until_ready(run(jnp.full_like(q, jnp.nan), jnp.full_like(kv, jnp.nan)))
    o, lse = run(q, kv)
    o_ref, lse_ref = mosaic_gpu.context_attention_xla(q.astype(jnp.float32), kv.astype(jnp.float32), ctx_lens,
                                                      bits, num_q=num_q, scale=0.04, v_dim=512, splits=splits,
                                                      balance=balance)
    assert_close(o, o_ref, TOL[jnp.bfloat16], "context O")
    if splits > 1:
        merged = [mosaic_gpu.combine_splits(a, b, ctx_lens, num_q=num_q, balance=balance)
                  for a, b in ((o, lse), (o_ref, lse_ref))]
        assert_close(*merged, TOL[jnp.bfloat16], "merged runs")
    assert lse.shape == lse_ref.shape == (o.shape[0], -(-rows // 64) * 64)
    lse, lse_ref = np.asarray(lse)[:, :rows], np.asarray(lse_ref)[:, :rows]    # past R: no row's
    np.testing.assert_array_equal(np.isinf(lse), np.isinf(lse_ref))
    seen = np.isfinite(lse_ref)
    np.testing.assert_allclose(lse[seen], lse_ref[seen], atol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not mosaic_gpu.is_hopper(), reason="Pallas Mosaic GPU kernel: Hopper GPU only")
@pytest.mark.parametrize("splits,balance,rows", [(1, False, 64), (3, False, 64), (8, False, 64), (3, True, 64),
                                                 (5, False, 8)])
def test_gpu_mosaic_decode_form(splits, balance, rows):
    """The kernel's decode form (the tail's mask from the context length and the node's bit 0)
    against its XLA twin at K2 widths over DECODE_CTX, every element, after a NaN-filled run; 8
    rows: a partial row block (its missing rows read as zeros, not stored)."""
    rng = fresh_rng()
    q, kv, ctx_lens, word = decode_case(rng, rows, 1032)
    q, kv = jnp.asarray(q, jnp.bfloat16), jnp.asarray(kv, jnp.bfloat16)
    kw = dict(num_q=1, scale=0.04, v_dim=512, splits=splits, balance=balance)
    run = jax.jit(lambda q, kv: mosaic_gpu.context_attention(q, kv, ctx_lens, word, **kw))
    jax.block_until_ready(run(jnp.full_like(q, jnp.nan), jnp.full_like(kv, jnp.nan)))
    o, lse = run(q, kv)
    o_ref, lse_ref = mosaic_gpu.context_attention_xla(q.astype(jnp.float32), kv.astype(jnp.float32), ctx_lens,
                                                      word, **kw)
    assert_close(o, o_ref, TOL[jnp.bfloat16], "decode-form O")
    lse, lse_ref = np.asarray(lse)[:, :rows], np.asarray(lse_ref)[:, :rows]
    np.testing.assert_array_equal(np.isinf(lse), np.isinf(lse_ref))
    seen = np.isfinite(lse_ref)
    np.testing.assert_allclose(lse[seen], lse_ref[seen], atol=1e-3)


_COMPILE_KERNEL = """
import functools, sys
import jax, jax.numpy as jnp
from pallas_kernels.mla_attention import mosaic_gpu
num_s, rows, slots, num_q, cluster, splits, balance = (int(a) for a in sys.argv[1:])
words = 4 * -(-(mosaic_gpu.PAIR - 1 + num_q) // mosaic_gpu.PAIR)
bits = (num_s,) if num_q == 1 else (num_s, words, rows)     # decode: the form prepare hands the kernel
args = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in (((num_s, rows, 576), jnp.bfloat16),
        ((num_s, slots, 576), jnp.bfloat16), ((num_s,), jnp.int32), (bits, jnp.int32))]
run = functools.partial(mosaic_gpu.context_attention, num_q=num_q, scale=0.04, v_dim=512, cluster=cluster,
                        splits=splits, balance=bool(balance))
jax.jit(run).trace(*args).lower().compile()
"""


@pytest.mark.gpu
@pytest.mark.skipif(not mosaic_gpu.is_hopper(), reason="Pallas Mosaic GPU kernel: Hopper GPU only")
@pytest.mark.parametrize("num_s,rows,slots,num_q,cluster,splits,balance", [
    (16, 64, 8200, 1, 1, 8, 0), (16, 64, 8200, 1, 1, 8, 1),    # decode, 8 runs per stream
    (16, 1024, 16392, 16, 2, 1, 1),                            # unsplit, longest stream first
    (8, 1024, 16392, 16, 2, 2, 1)])                            # launch's one-wave split
def test_gpu_mosaic_kernel_does_not_spill(num_s, rows, slots, num_q, cluster, splits, balance):
    """ptxas spills none of the kernel's registers (its report, MOSAIC_GPU_DUMP_PTXAS, read from a
    fresh process's compile), with balance at 16 streams too: the run schedule's values must not
    stay live into the consumers' loops, where a spill slows them (docs/kernels/mla_attention.md,
    "Variants measured and not taken")."""
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _COMPILE_KERNEL, *map(str, (num_s, rows, slots, num_q, cluster,
                                                                           splits, balance))],
                         capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, MOSAIC_GPU_DUMP_PTXAS="1"))
    assert out.returncode == 0, out.stderr[-2000:]
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out.stdout + out.stderr)
    assert spills, f"no ptxas report in the compile's output: {out.stdout[-500:]}"
    assert all(st == ld == "0" for st, ld in spills), spills


@pytest.mark.gpu
@pytest.mark.skipif(not mosaic_gpu.is_hopper(), reason="Pallas Mosaic GPU kernel: Hopper GPU only")
@pytest.mark.parametrize("cluster,splits", [(1, 1), (2, 3)])
def test_gpu_mosaic_timeline(cluster, splits):
    """context_attention(timeline=True): the same O and lse as without it, and for every CTA
    (stream, row block, run) the TIMELINE points in the order the kernel passes them (the low
    word of %globaltimer, compared modulo 2^32), within a second of each other, on an SM id."""
    ctx_lens = jnp.asarray([0, 300, 2100], jnp.int32)
    rng = fresh_rng()
    q = jnp.asarray(rng.standard_normal((3, 128, 576)), jnp.bfloat16)
    kv = jnp.asarray(rng.standard_normal((3, 2200, 576)), jnp.bfloat16)
    bits = jnp.asarray(random_tail_bits(rng, [c // mosaic_gpu.PAIR for c in [0, 300, 2100]], 4, 128, 2200,
                                        np.zeros((3, 128), bool)))
    run = functools.partial(mosaic_gpu.context_attention, num_q=8, scale=0.04, v_dim=512, cluster=cluster,
                            splits=splits)
    o, lse = jax.jit(run)(q, kv, ctx_lens, bits)
    o_t, lse_t, times = jax.jit(functools.partial(run, timeline=True))(q, kv, ctx_lens, bits)
    np.testing.assert_array_equal(np.asarray(o_t), np.asarray(o))
    np.testing.assert_array_equal(np.asarray(lse_t), np.asarray(lse))
    names = mosaic_gpu.TIMELINE
    times = np.asarray(times).astype(np.int64)
    assert times.shape == (3, 2, splits, len(names))
    t = times[..., :-1].reshape(-1, len(names) - 1)
    t = (t - t[:, :1] + 2 ** 31) % 2 ** 32 - 2 ** 31       # signed ns after each CTA's start (the producer may be first)
    at = {n: t[:, i] for i, n in enumerate(names[:-1])}
    order = ["start", "q_ready", "loops_done", "sums_done", "stores_issued", "end"]
    for a, b in zip(order, order[1:]):
        assert (at[a] <= at[b]).all(), (a, b, at[a], at[b])
    assert (at["loops_done_1"] <= at["end"]).all() and (at["last_load"] <= at["end"]).all()
    assert (at["end"] < 10 ** 9).all() and (at["last_load"] > -10 ** 9).all()
    smid = times[..., -1]
    assert ((smid >= 0) & (smid < 1024)).all()


def test_run_bounds_balance_the_runs():
    """Runs cover 0 .. total in order, differ by at most one pair, and the longer runs come last
    (the last run holds the tail)."""
    for total in range(0, 30):
        for splits in range(1, 10):
            bounds = [tuple(int(x) for x in runs.run_bounds(jnp.int32(total), splits, jnp.int32(k)))
                      for k in range(splits)]
            assert bounds[0][0] == 0 and sum(n for _, n in bounds) == total, (total, splits, bounds)
            assert all(f + n == g for (f, n), (g, _) in zip(bounds, bounds[1:])), (total, splits, bounds)
            sizes = [n for _, n in bounds]
            assert sizes == sorted(sizes) and sizes[-1] - sizes[0] <= 1, (total, splits, bounds)


@pytest.mark.parametrize("splits,balance", [(1, False), (2, False), (3, False), (2, True), (3, True)])
def test_mosaic_context_twin_matches_its_contract(splits, balance):
    """context_attention_xla (what the GPU test holds the kernel to) against a float64 loop over
    context_attention's contract: every key below 128 pairs, then tail key 128 pairs + t (t below
    64 tail tiles) where its bit is set; splits > 1: part f is run f % splits of stream f //
    splits, or with balance run k of stream s under the schedule (tests/kernels/test_mla_merge.py's
    schedule_py: 3 * splits CTAs shared out by the streams' pairs; splits 3: 2, 2, 5 runs, stream
    0's first empty), runs of `run_bounds` over pairs + ceil(tail_tiles / 2).
    Pairs 0 / 1 / 6, tail tiles 1 / 3 / 1 (odd: half pairs)."""
    from tests.kernels.test_mla_merge import schedule_py, totals_py
    rng = fresh_rng()
    ctx, num_q, rows, n = [3, 198, 768], 60, 8, 900
    counts = [c // mosaic_gpu.PAIR for c in ctx]
    tails = [-(-(c % mosaic_gpu.PAIR + num_q) // mosaic_gpu.BLOCK_K) for c in ctx]
    assert tails == [1, 3, 1]
    empty = np.zeros((3, rows), bool)
    empty[0, 1] = True                                    # stream 0 row 1: no key at all
    bits = random_tail_bits(rng, counts, 8, rows, n, empty)
    q, kv = rng.standard_normal((3, rows, 16)), rng.standard_normal((3, n, 16))
    o, lse = mosaic_gpu.context_attention_xla(jnp.asarray(q, jnp.float32), jnp.asarray(kv, jnp.float32),
                                              jnp.asarray(ctx), jnp.asarray(bits), num_q=num_q,
                                              scale=0.3, v_dim=8, splits=splits, balance=balance)
    if not balance:
        runs_of, firsts = [splits] * 3, [0, splits, 2 * splits]
    else:
        runs_of, firsts = schedule_py(totals_py(ctx, num_q), 3 * splits)
        assert splits != 3 or runs_of == [2, 2, 5]
    c = 0.3 * np.log2(np.e)
    words = bits.view(np.uint32)
    for s in range(3):
        total, k_s = counts[s] + -(-tails[s] // 2), runs_of[s]
        per, rem = divmod(total, k_s)
        for k in range(k_s):
            first = k * per + max(0, k - (k_s - rem))
            last = first + per + (k >= k_s - rem)
            f = firsts[s] + k
            for r in range(rows):
                start = mosaic_gpu.PAIR * counts[s]
                keys = [j for j in range(mosaic_gpu.PAIR * first, min(mosaic_gpu.PAIR * last, n))
                        if j < start or (j - start < mosaic_gpu.BLOCK_K * tails[s]
                                         and words[s, (j - start) // 32, r] >> ((j - start) % 32) & 1)]
                if not keys:
                    assert lse[f, r] == -np.inf and not np.any(o[f, r]), (s, k, r)
                    continue
                st = c * kv[s, keys] @ q[s, r]
                p = np.exp2(st - st.max())
                np.testing.assert_allclose(o[f, r], p @ kv[s, keys, :8] / p.sum(), rtol=1e-4, atol=1e-5)
                np.testing.assert_allclose(lse[f, r], st.max() + np.log2(p.sum()), rtol=1e-5, atol=1e-5)
