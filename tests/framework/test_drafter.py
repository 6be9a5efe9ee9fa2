"""DFlash drafter: numpy golden, cached vs uncached forward, per-stream caches, HF-layout IO, bad input."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util
from safetensors import safe_open
from safetensors.numpy import save_file

from ddtree_jax import drafter as dr
from ddtree_jax.config import ConfigError, DrafterConfig, ModelConfig, default_target_layer_ids
from ddtree_jax.drafter_io import DrafterCheckpointError, load_drafter, save_drafter
from ddtree_jax.reference.drafter_ref import drafter_hidden_reference
from tests.kernel_testing import assert_close

GQA = DrafterConfig(hidden_size=32, vocab_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=8, intermediate_size=48,
                    target_layer_ids=(0, 2, 3), num_target_layers=5, block_size=4,
                    mask_token_id=63, rope_theta=10000.0)
# XLA compiles on a shared CPU are the cost here: every test reuses these shapes.
hidden_jit = jax.jit(dr.drafter_hidden, static_argnums=1)        # B=2, n=5, b=4
append_jit = jax.jit(dr.append_context, static_argnums=1)        # S=4, n=4, max_ctx=12
draft_jit = jax.jit(dr.draft_block, static_argnums=1)            # S=4, b=4, max_ctx=12
POS = jnp.asarray(np.stack([np.arange(9), np.arange(9) + 11]), jnp.int32)


def random_params(cfg=GQA, seed=0, dtype=jnp.float32):
    """init_drafter params with the norm scales randomised too (so a misplaced norm shows)."""
    flat = traverse_util.flatten_dict(dr.init_drafter(cfg, jax.random.key(seed)))
    rng = np.random.default_rng(seed)
    for key, leaf in flat.items():
        if key[-1] == "scale":
            leaf = 1.0 + 0.3 * rng.standard_normal(leaf.shape)
        flat[key] = jnp.asarray(leaf, dtype)
    return traverse_util.unflatten_dict(flat)


def taps(cfg, rng, *shape):
    return jnp.asarray(rng.standard_normal((*shape, len(cfg.target_layer_ids) * cfg.hidden_size)),
                       jnp.float32)


def hidden(cfg, rng, *shape):
    return jnp.asarray(rng.standard_normal((*shape, cfg.hidden_size)), jnp.float32)


def test_drafter_hidden_matches_numpy_golden():
    """GQA with 2 query heads per kv head, 2 layers, 3 taps, two rows at different positions."""
    cfg, rng = GQA, np.random.default_rng(1)
    params = random_params(cfg, 1)
    th, noise = taps(cfg, rng, 2, 5), hidden(cfg, rng, 2, 4)
    out = hidden_jit(params, cfg, th, noise, POS)
    assert out.shape == (2, 4, cfg.hidden_size) and out.dtype == jnp.float32
    assert_close(out, drafter_hidden_reference(params, cfg, th, noise, POS), 1e-5, "drafter_hidden")


def _filled_cache(cfg, params, ctx_taps, lengths, rng, chunk=4, max_ctx=12):
    """Append each stream's context in random-sized pieces (chunk tokens per call, padded with
    garbage) into a cache whose unused slots hold large garbage."""
    num_streams = len(lengths)
    cache = dr.init_drafter_cache(cfg, num_streams, max_ctx, jnp.float32)
    junk = lambda a: jnp.asarray(100 * rng.standard_normal(a.shape), a.dtype)
    cache = dr.DrafterCache(junk(cache.k), junk(cache.v), cache.lengths)
    done = np.zeros(num_streams, int)
    while (done < lengths).any():
        num_new = np.array([rng.integers(0, min(chunk, r) + 1) for r in lengths - done])
        th = np.array(taps(cfg, rng, num_streams, chunk))
        for s in range(num_streams):
            th[s, :num_new[s]] = ctx_taps[s][done[s]:done[s] + num_new[s]]
        pos = done[:, None] + np.arange(chunk)
        cache = append_jit(params, cfg, cache, jnp.asarray(th), jnp.asarray(pos, jnp.int32),
                           jnp.asarray(num_new, jnp.int32))
        done += num_new
    np.testing.assert_array_equal(cache.lengths, lengths)
    return cache


def test_cached_path_matches_full_forward():
    """Context appended in random pieces, then one block: equals drafter_hidden on the whole
    context (streams 0 and 3, the shape already compiled) and the golden (every stream)."""
    cfg, rng = GQA, np.random.default_rng(2)
    params = random_params(cfg, 2)
    lengths = np.array([5, 1, 10, 5])
    ctx_taps = [np.asarray(taps(cfg, rng, n)) for n in lengths]
    cache = _filled_cache(cfg, params, ctx_taps, lengths, rng)
    noise = hidden(cfg, rng, 4, 4)
    block_pos = jnp.asarray(lengths[:, None] + np.arange(4), jnp.int32)
    out = draft_jit(params, cfg, cache, noise, block_pos)
    full = hidden_jit(params, cfg, jnp.asarray(np.stack([ctx_taps[0], ctx_taps[3]])),
                      noise[jnp.asarray([0, 3])], jnp.tile(jnp.arange(9, dtype=jnp.int32), (2, 1)))
    assert_close(out[0], full[0], 1e-5, "stream 0 vs drafter_hidden")
    assert_close(out[3], full[1], 1e-5, "stream 3 vs drafter_hidden")
    for s, n in enumerate(lengths):
        ref = drafter_hidden_reference(params, cfg, ctx_taps[s][None], noise[s:s + 1],
                                       np.arange(n + 4)[None])
        assert_close(out[s], ref[0], 1e-5, f"stream {s} (context {n}) vs golden")


def test_streams_are_independent():
    cfg, rng = GQA, np.random.default_rng(3)
    params = random_params(cfg, 3)
    lengths = np.array([4, 6, 2, 9])
    cache = _filled_cache(cfg, params, [np.asarray(taps(cfg, rng, n)) for n in lengths], lengths, rng)
    noise = hidden(cfg, rng, 4, 4)
    block_pos = jnp.asarray(lengths[:, None] + np.arange(4), jnp.int32)
    before = draft_jit(params, cfg, cache, noise, block_pos)
    # Grow stream 0 only: the other rows of the cache and their drafts do not move.
    grown = append_jit(params, cfg, cache, taps(cfg, rng, 4, 4), jnp.zeros((4, 4), jnp.int32) + 4,
                       jnp.asarray([3, 0, 0, 0], jnp.int32))
    np.testing.assert_array_equal(grown.lengths, [7, 6, 2, 9])
    np.testing.assert_array_equal(grown.k[:, 1:], cache.k[:, 1:])
    np.testing.assert_array_equal(grown.v[:, 1:], cache.v[:, 1:])
    np.testing.assert_array_equal(grown.k[:, 0, :, :4], cache.k[:, 0, :, :4])
    noise0 = noise.at[0].set(hidden(cfg, rng, 4))
    after = draft_jit(params, cfg, grown, noise0, block_pos)
    np.testing.assert_allclose(after[1:], before[1:], rtol=1e-6, atol=1e-6)
    assert not np.allclose(after[0], before[0])


def test_append_rejects_overflow_and_bad_num_new():
    cfg = GQA
    params = random_params()
    cache = dr.init_drafter_cache(cfg, 2, 5, jnp.float32)._replace(lengths=jnp.asarray([3, 0]))
    th, pos = jnp.zeros((2, 4, 96)), jnp.zeros((2, 4), jnp.int32)
    with pytest.raises(ValueError, match="overflow"):
        dr.append_context(params, cfg, cache, th, pos, jnp.asarray([3, 1]))
    with pytest.raises(ValueError, match="num_new"):
        dr.append_context(params, cfg, cache, th, pos, jnp.asarray([5, 0]))
    with pytest.raises(ValueError, match="target_hidden"):
        dr.append_context(params, cfg, cache, th[..., :64], pos, jnp.asarray([1, 1]))


def test_drafter_hidden_rejects_bad_shapes():
    cfg, rng = GQA, np.random.default_rng(4)
    params = random_params()
    th, noise = taps(cfg, rng, 1, 3), hidden(cfg, rng, 1, 4)
    pos = jnp.arange(7)[None]
    with pytest.raises(ValueError, match=r"target_hidden has shape \[1, 3, 32\], expected \[\*, \*, 96\]"):
        dr.drafter_hidden(params, cfg, th[..., :32], noise, pos)
    with pytest.raises(ValueError, match="noise_embedding"):
        dr.drafter_hidden(params, cfg, th, noise[..., :16], pos)
    with pytest.raises(ValueError, match="positions"):
        dr.drafter_hidden(params, cfg, th, noise, pos[:, :6])


def test_block_embedding_and_draft_logits():
    cfg, rng = GQA, np.random.default_rng(5)
    target = {"embed_tokens": {"embedding": jnp.asarray(rng.standard_normal((64, 32)), jnp.float32)},
              "lm_head": {"kernel": jnp.asarray(rng.standard_normal((32, 64)), jnp.float32)}}
    emb = dr.block_embedding(target, cfg, jnp.asarray([5, 9]))
    table = np.asarray(target["embed_tokens"]["embedding"])
    np.testing.assert_array_equal(emb[:, 0], table[[5, 9]])
    np.testing.assert_array_equal(emb[:, 1:], np.broadcast_to(table[63], (2, 3, 32)))
    h = hidden(cfg, rng, 2, 3)
    logits = dr.draft_logits(target, h)
    assert logits.dtype == jnp.float32
    assert_close(logits, np.asarray(h, np.float64) @ np.asarray(target["lm_head"]["kernel"], np.float64),
                 1e-6, "draft_logits")


# ---- HF layout ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_save_load_round_trip(tmp_path, dtype):
    cfg, rng = GQA, np.random.default_rng(6)
    params = random_params(cfg, 6, dtype)
    save_drafter(tmp_path, cfg, params)
    with safe_open(os.path.join(tmp_path, "model.safetensors"), framework="numpy") as f:
        assert f.get_slice("layers.0.self_attn.q_proj.weight").get_shape() == [32, 32]
        assert f.get_slice("layers.1.mlp.down_proj.weight").get_shape() == [32, 48]
        assert f.get_slice("fc.weight").get_shape() == [32, 96]
    assert json.load(open(tmp_path / "config.json"))["dflash_config"]["target_layer_ids"] == [0, 2, 3]
    cfg2, params2 = load_drafter(tmp_path, dtype)
    assert cfg2 == cfg
    assert jax.tree.structure(params2) == jax.tree.structure(params)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    if dtype == jnp.float32:
        th, noise = taps(cfg, rng, 2, 5), hidden(cfg, rng, 2, 4)
        np.testing.assert_array_equal(hidden_jit(params, cfg, th, noise, POS),
                                      hidden_jit(params2, cfg2, th, noise, POS))


def _rewrite(path, edit):
    """Apply `edit` to the tensors dict of path/model.safetensors and write it back."""
    fname = os.path.join(path, "model.safetensors")
    with safe_open(fname, framework="numpy") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    edit(tensors)
    save_file(tensors, fname)


def _put(name, value):
    return lambda t: t.update({name: value})


@pytest.mark.parametrize("edit, pattern", [
    (lambda t: t.pop("layers.1.self_attn.k_norm.weight"),
     r"missing tensor\(s\): layers\.1\.self_attn\.k_norm\.weight"),
    (_put("embed_tokens.weight", np.zeros((64, 32), np.float32)),
     r"unexpected tensor\(s\): embed_tokens\.weight"),
    (_put("layers.0.self_attn.q_norm.weight", np.ones(9, np.float32)),
     r"layers\.0\.self_attn\.q_norm\.weight: shape \[9\], expected \[8\]"),
    (_put("fc.weight", np.zeros((96, 32), np.float32)),
     r"fc\.weight: shape \[96, 32\], expected \[32, 96\]"),
    (_put("norm.weight", np.ones(32, np.int32)), r"norm\.weight: dtype I32"),
], ids=["missing", "extra", "shape", "transposed", "dtype"])
def test_load_rejects_bad_tensors(tmp_path, edit, pattern):
    save_drafter(tmp_path, GQA, random_params())
    _rewrite(tmp_path, edit)
    with pytest.raises(DrafterCheckpointError, match=pattern):
        load_drafter(tmp_path, jnp.float32)


def _shard(path, tensors):
    """Write `tensors` as a.safetensors (even-indexed names) and b.safetensors (the rest);
    returns the correct weight_map."""
    names = sorted(tensors)
    shards = {"a.safetensors": names[::2], "b.safetensors": names[1::2]}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, os.path.join(path, shard))
    return {k: shard for shard, keys in shards.items() for k in keys}


def _sharded_checkpoint(path):
    save_drafter(path, GQA, random_params())
    fname = os.path.join(path, "model.safetensors")
    with safe_open(fname, framework="numpy") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    os.remove(fname)
    return _shard(path, tensors)


def test_load_sharded_and_missing_files(tmp_path):
    cfg = GQA
    params = random_params(cfg, 7)
    save_drafter(tmp_path, cfg, params)
    fname = os.path.join(tmp_path, "model.safetensors")
    with safe_open(fname, framework="numpy") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    os.remove(fname)
    with pytest.raises(DrafterCheckpointError, match="no model.safetensors"):
        load_drafter(tmp_path)
    weight_map = _shard(tmp_path, tensors)
    json.dump({"weight_map": weight_map}, open(tmp_path / "model.safetensors.index.json", "w"))
    _, params2 = load_drafter(tmp_path, jnp.float32)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
        np.testing.assert_array_equal(a, b)


def test_load_rejects_index_naming_the_wrong_shard(tmp_path):
    weight_map = _sharded_checkpoint(tmp_path)
    weight_map["norm.weight"] = "b.safetensors" if weight_map["norm.weight"] == "a.safetensors" \
        else "a.safetensors"
    json.dump({"weight_map": weight_map}, open(tmp_path / "model.safetensors.index.json", "w"))
    wrong = weight_map["norm.weight"].replace(".", r"\.")
    with pytest.raises(DrafterCheckpointError, match=rf"'norm\.weight'.*under {wrong} but not in it"):
        load_drafter(tmp_path, jnp.float32)


def test_load_rejects_index_without_weight_map(tmp_path):
    _sharded_checkpoint(tmp_path)
    json.dump({"metadata": {"total_size": 0}}, open(tmp_path / "model.safetensors.index.json", "w"))
    with pytest.raises(DrafterCheckpointError, match=r"model\.safetensors\.index\.json: no 'weight_map'"):
        load_drafter(tmp_path, jnp.float32)


def test_save_rejects_mismatched_params(tmp_path):
    params = random_params()
    bad = r"param layers_0/mlp/down_proj/kernel has shape \[48, 32\], expected \[40, 32\]"
    with pytest.raises(DrafterCheckpointError, match=bad):
        save_drafter(tmp_path, GQA.replace(intermediate_size=40), params)
    del params["layers_0"]["self_attn"]["k_norm"]
    with pytest.raises(DrafterCheckpointError, match="missing layers_0/self_attn/k_norm/scale"):
        save_drafter(tmp_path, GQA, params)


# ---- config.json parsing and config checks ---------------------------------------------------

ZLAB_B16 = {  # the Qwen3-4B-DFlash-b16 layout (block_size and num_target_layers at top level)
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": 16,
    "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
    "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 5,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "num_target_layers": 36,
    "max_position_embeddings": 40960, "rope_theta": 1000000, "rms_norm_eps": 1e-06,
    "tie_word_embeddings": True, "vocab_size": 151936, "dtype": "bfloat16", "rope_scaling": None,
    "attention_bias": False, "hidden_act": "silu", "use_sliding_window": False,
}


def test_from_hf_reads_zlab_configs():
    cfg = DrafterConfig.from_hf(ZLAB_B16)
    assert (cfg.block_size, cfg.mask_token_id, cfg.target_layer_ids) == (16, 151669, (1, 9, 17, 25, 33))
    assert (cfg.num_target_layers, cfg.head_dim, cfg.num_key_value_heads) == (36, 128, 8)
    assert cfg.rope_theta == 1e6 and cfg.rms_norm_eps == 1e-6
    newer = {k: v for k, v in ZLAB_B16.items() if k not in ("block_size", "rope_theta")}
    newer.update(rope_parameters={"rope_theta": 5e5, "rope_type": "default"},
                 layer_types=["full_attention"] * 5,
                 dflash_config={"block_size": 8, "mask_token_id": 7, "target_layer_ids": [2, 3]})
    cfg = DrafterConfig.from_hf(newer)
    assert (cfg.block_size, cfg.mask_token_id, cfg.target_layer_ids, cfg.rope_theta) == (8, 7, (2, 3), 5e5)
    del newer["dflash_config"]["target_layer_ids"]
    assert DrafterConfig.from_hf(newer).target_layer_ids == (1, 9, 17, 25, 33)
    assert DrafterConfig.from_hf(GQA.to_hf()) == GQA


@pytest.mark.parametrize("change, pattern", [
    (lambda d: d["dflash_config"].pop("mask_token_id"), "mask_token_id"),
    (lambda d: d.pop("head_dim"), "head_dim"),
    (lambda d: d.update(architectures=["DFlash2DraftModel"]), "DFlash2DraftModel"),
    (lambda d: d.update(layer_types=["sliding_attention"] * 5), "sliding-window"),
    (lambda d: d.update(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope_scaling"),
    (lambda d: d["dflash_config"].update(final_logit_softcapping=20.0), "final_logit_softcapping"),
    (lambda d: d.update(block_size=1), "block_size must be >= 2"),
    (lambda d: d["dflash_config"].update(target_layer_ids=[1, 36]), r"target_layer_ids \[36\] out of range"),
], ids=["no-mask", "no-head-dim", "dflash2", "sliding", "rope-scaling", "softcap", "block-1", "ids"])
def test_from_hf_rejects_bad_configs(change, pattern):
    d = json.loads(json.dumps(ZLAB_B16))
    change(d)
    with pytest.raises(ConfigError, match=pattern):
        DrafterConfig.from_hf(d)


def test_config_checks_against_target():
    target = ModelConfig.preset("tiny")
    cfg = DrafterConfig.for_target(target)
    cfg.check_target(target)
    assert cfg.target_layer_ids == (target.num_hidden_layers // 2,)
    with pytest.raises(ConfigError, match="hidden_size=32 != target hidden_size=64"):
        cfg.replace(hidden_size=32).check_target(target)
    with pytest.raises(ConfigError, match="vocab_size=100 != target vocab_size=512"):
        cfg.replace(vocab_size=100, mask_token_id=0).check_target(target)
    with pytest.raises(ConfigError, match="block_size must be >= 2"):
        cfg.replace(block_size=1)
    with pytest.raises(ConfigError, match=r"target_layer_ids \[3\] out of range \[0, 3\)"):
        cfg.replace(target_layer_ids=(0, 3))
    assert default_target_layer_ids(36, 5) == (1, 9, 17, 25, 33)
    assert default_target_layer_ids(61, 5) == (1, 15, 30, 44, 58)
    assert default_target_layer_ids(36, 1) == (18,)
