"""The drafter's block attention: every implementation against the float64 numpy golden, and the
drafter's cached block forward with each implementation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ddtree_jax as dj
from ddtree_jax import drafter as dr
from pallas_kernels.drafter_attention import drafter_attention
from pallas_kernels.drafter_attention.pallas_triton import drafter_attention_pallas
from pallas_kernels.drafter_attention.reference import drafter_attention_reference
from tests.kernel_testing import assert_close, fresh_rng, runnable_impls


def _inputs(rng, bsz, b, h, kvh, hd, n, dtype=np.float32):
    """Random operands; stream 0 has no context, stream 1 (if any) a full cache, the rest random
    lengths."""
    draw = lambda *shape: rng.standard_normal(shape).astype(dtype)   # noqa: E731
    lengths = rng.integers(1, n + 1, bsz).astype(np.int32)
    lengths[0] = 0
    if bsz > 1:
        lengths[1] = n
    return (draw(bsz, b, h, hd), draw(bsz, kvh, n, hd), draw(bsz, kvh, n, hd), lengths,
            draw(bsz, b, kvh, hd), draw(bsz, b, kvh, hd))


# (B, b, H, KV, hd, N): the shipped drafter (b 16, 4 heads over 1 KV head, hd 64), grouped heads,
# one query head per KV head, a block that is not a power of two, N not a multiple of any tile
SHAPES = [(2, 16, 4, 1, 64, 100), (3, 5, 8, 2, 16, 37), (1, 16, 4, 4, 32, 64), (2, 3, 2, 1, 8, 1)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("impl", runnable_impls("drafter_attention"))
def test_matches_golden_float32(impl, shape):
    """Cache slots at or past a stream's context length hold NaN (stale slots may hold anything):
    they must not reach the output."""
    rng = fresh_rng()
    args = _inputs(rng, *shape)
    scale = shape[4] ** -0.5
    stale = np.arange(shape[5])[None, None, :, None] >= args[3][:, None, None, None]
    poisoned = [np.where(stale, np.nan, a) if i in (1, 2) else a for i, a in enumerate(args)]
    out = drafter_attention(*map(jnp.asarray, poisoned), scale=scale, impl=impl)
    assert out.shape == shape[:3] + (shape[4],) and out.dtype == jnp.float32
    assert_close(out, drafter_attention_reference(*args, scale=scale), 2e-6, impl)


@pytest.mark.parametrize("impl", runnable_impls("drafter_attention"))
@pytest.mark.parametrize("hd", [64, 8])
def test_matches_golden_bfloat16(impl, hd):
    """bf16 operands, float32 accumulation and softmax: relative error within 4e-3 (the
    probabilities are rounded to bf16 before P @ V; over 150 seeds at most 1.9e-3 (xla) / 1.3e-3
    (pallas_triton) at head_dim 64, 2.7e-3 / 2.4e-3 at head_dim 8).
    head_dim 8 takes pallas_compat.dot_f32's K < 16 path (a 16-bit K = 8 Triton dot is wrong on
    the H200)."""
    rng = fresh_rng()
    args = _inputs(rng, 2, 16, 4, 1, hd, 300)
    bf = [jnp.asarray(a, jnp.bfloat16) if a.dtype != np.int32 else jnp.asarray(a) for a in args]
    ref = drafter_attention_reference(*[np.asarray(x, np.float64 if x.dtype == jnp.bfloat16 else x.dtype)
                                       for x in bf], scale=0.125)
    assert_close(drafter_attention(*bf, scale=0.125, impl=impl), ref, 4e-3, impl)


@pytest.mark.parametrize("block_n,splits", [(16, 1), (64, 1), (16, 3), (8, 5), (16, None)])
def test_pallas_splits_write_every_row(block_n, splits):
    """One split or several (partials and the combine), including splits past a stream's
    context, ranges that end mid-tile, and the default; outputs poisoned with NaN before the
    kernel runs, so every row must be written."""
    rng = fresh_rng()
    args = _inputs(rng, 4, 5, 8, 2, 16, 37)
    out = drafter_attention_pallas(*map(jnp.asarray, args), scale=0.25, block_n=block_n,
                                   num_splits=splits, poison=True)
    assert_close(out, drafter_attention_reference(*args, scale=0.25), 2e-6, f"{block_n}x{splits}")


@pytest.mark.parametrize("shape", [(2, 16, 4, 1, 64, 100), (3, 5, 8, 2, 16, 37)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("impl", runnable_impls("drafter_attention"))
def test_stacked_cache_reads_its_layer(impl, shape):
    """ctx_k / ctx_v as a stacked [L, B, KV, N, hd] cache with `layer`: layer i's golden (the other
    layers hold different values, so reading the wrong one fails); the Pallas outputs poisoned."""
    rng = fresh_rng()
    layers = [_inputs(rng, *shape) for _ in range(3)]
    q, _, _, lengths, kb, vb = layers[0]
    ck = np.stack([x[1] for x in layers])
    cv = np.stack([x[2] for x in layers])
    scale = shape[4] ** -0.5
    for i in range(3):
        args = (q, ck, cv, lengths, kb, vb)
        if impl == "pallas_triton":
            out = drafter_attention_pallas(*map(jnp.asarray, args), scale=scale, layer=i, poison=True)
        else:
            out = drafter_attention(*map(jnp.asarray, args), scale=scale, layer=i, impl=impl)
        ref = drafter_attention_reference(q, ck[i], cv[i], lengths, kb, vb, scale=scale)
        assert_close(out, ref, 2e-6, f"{impl} layer {i}")


def test_default_splits():
    """Up to 128 programs in all, never more splits than context tiles."""
    from pallas_kernels.drafter_attention.pallas_triton import default_splits
    assert default_splits(1, 289, 64) == 5          # one stream: one tile per split
    assert default_splits(16, 1024, 64) == 8        # 16 streams: 128 programs
    assert default_splits(128, 1000, 64) == 1
    assert default_splits(1, 1, 64) == 1


def test_bad_shapes_are_named():
    rng = fresh_rng()
    q, ck, cv, m, kb, vb = map(jnp.asarray, _inputs(rng, 2, 4, 4, 2, 8, 10))
    with pytest.raises(ValueError, match="ctx_k"):
        drafter_attention(q, ck[..., :4], cv, m, kb, vb, scale=1.0)
    with pytest.raises(ValueError, match="KV heads"):
        drafter_attention(q[:, :, :3], ck, cv, m, kb, vb, scale=1.0)
    with pytest.raises(ValueError, match="ctx_lengths"):
        drafter_attention(q, ck, cv, m[:1], kb, vb, scale=1.0)
    with pytest.raises(ValueError, match="ctx_lengths"):
        drafter_attention(q, ck, cv, m.astype(jnp.float32), kb, vb, scale=1.0)
    with pytest.raises(ValueError, match="v_blk"):
        drafter_attention(q, ck, cv, m, kb, vb[:, :2], scale=1.0)
    for bad in ([0, 11], [-1, 3]):      # N = 10 slots
        with pytest.raises(ValueError, match=r"ctx_lengths must lie in \[0, N=10\]"):
            drafter_attention(q, ck, cv, jnp.asarray(bad, jnp.int32), kb, vb, scale=1.0)
    stack = jnp.stack([ck, ck])
    for layer in (2, -1, True):
        with pytest.raises(ValueError, match="stacked cache"):
            drafter_attention(q, stack, stack, m, kb, vb, scale=1.0, layer=layer)
    with pytest.raises(ValueError, match="stacked cache"):
        drafter_attention(q, ck, cv, m, kb, vb, scale=1.0, layer=0)    # not stacked
    with pytest.raises(ValueError, match="ctx_v"):
        drafter_attention(q, stack, stack[:1], m, kb, vb, scale=1.0, layer=0)
    with pytest.raises(ValueError, match="power-of-two head_dim"):
        drafter_attention_pallas(q[..., :6], ck[..., :6], cv[..., :6], m, kb[..., :6], vb[..., :6],
                                 scale=1.0)


def test_draft_block_is_the_same_with_either_implementation():
    """The engine's cached block forward through the Pallas kernel equals the xla path."""
    cfg = dj.ModelConfig.preset("tiny").replace(vocab_size=64)
    dcfg = dj.DrafterConfig.for_target(cfg, block_size=5, num_hidden_layers=2)
    params = dj.init_drafter(dcfg, jax.random.key(1))
    rng = fresh_rng()
    cache = dr.init_drafter_cache(dcfg, 3, 24, jnp.float32)
    taps = jnp.asarray(rng.standard_normal((3, 9, dr._taps_width(dcfg))), jnp.float32)
    pos = jnp.broadcast_to(jnp.arange(9, dtype=jnp.int32), (3, 9))
    cache = dr.append_context(params, dcfg, cache, taps, pos, jnp.asarray([9, 4, 0], jnp.int32))
    noise = jnp.asarray(rng.standard_normal((3, 5, dcfg.hidden_size)), jnp.float32)
    bpos = cache.lengths[:, None] + jnp.arange(5, dtype=jnp.int32)
    ref = dr.draft_block(params, dcfg, cache, noise, bpos, attn_impl="xla")
    out = dr.draft_block(params, dcfg, cache, noise, bpos, attn_impl="pallas_triton")
    assert_close(out, ref, 1e-5, "draft_block")
