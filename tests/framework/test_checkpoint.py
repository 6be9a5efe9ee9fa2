"""HF safetensors and Orbax checkpoints of the target: round trips, layouts, and bad input."""

import dataclasses
import functools
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from ddtree_jax.checkpoint import (CheckpointError, load_target, restore_checkpoint, save_checkpoint,
                                   save_target_hf)
from ddtree_jax.config import ConfigError, ModelConfig, QuantConfig
from ddtree_jax.model import target_logits
from pallas_kernels import moe
from tests.io_testing import assert_identical, like_init, random_params

TOKENS = np.arange(10, dtype=np.int32).reshape(2, 5) * 37 % 512
LM = "language_model."


def _cfg(quant: str, **kw) -> ModelConfig:
    return ModelConfig.preset("tiny", quant=QuantConfig(quant, 32), **kw)


@functools.cache
def _model(quant: str):
    """(cfg, float32 params, reference logits) of the tiny preset with `quant` experts."""
    cfg = _cfg(quant)
    params = random_params(cfg, jnp.float32)
    return cfg, params, np.asarray(target_logits(params, cfg, TOKENS))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """quant -> a single-file HF checkpoint of _model(quant)."""
    @functools.cache
    def get(quant: str):
        path = tmp_path_factory.mktemp(f"hf_{quant}")
        save_target_hf(path, *_model(quant)[:2])
        return path
    return get


def _copy(src, dst, edit_tensors=None, edit_config=None):
    """Copy a single-file checkpoint, editing its tensor dict and/or its config dict in place."""
    os.makedirs(dst, exist_ok=True)
    tensors = load_file(os.path.join(src, "model.safetensors"))
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    if edit_tensors:
        edit_tensors(tensors)
    if edit_config:
        edit_config(config)
    save_file(tensors, os.path.join(dst, "model.safetensors"))
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f)
    return dst


# ---- round trips ---------------------------------------------------------------------------

@pytest.mark.parametrize("shard_bytes", [None, 40_000], ids=["single", "sharded"])
@pytest.mark.parametrize("prefix", ["", LM], ids=["k2", "k2_6"])
@pytest.mark.parametrize("quant", ["bf16", "int4"])
def test_hf_round_trip(tmp_path, quant, shard_bytes, prefix):
    cfg, params, logits = _model(quant)
    save_target_hf(tmp_path, cfg, params, max_shard_bytes=shard_bytes, prefix=prefix)
    files = sorted(os.listdir(tmp_path))
    assert ("model.safetensors.index.json" in files) == (shard_bytes is not None)
    if shard_bytes:
        assert sum(f.endswith(".safetensors") for f in files) > 2
    with open(tmp_path / "config.json") as f:
        assert ("text_config" in json.load(f)) == bool(prefix)
    first = next(f for f in files if f.endswith(".safetensors"))
    assert all(k.startswith(LM) == bool(prefix) for k in load_file(tmp_path / first))
    cfg2, params2 = load_target(tmp_path, dtype=jnp.float32)
    assert cfg2 == cfg
    like_init(cfg, params2, jnp.float32)
    assert_identical(params, params2)
    np.testing.assert_array_equal(np.asarray(target_logits(params2, cfg2, TOKENS)), logits)


@pytest.mark.parametrize("quant", ["bf16", "int4"])
def test_hf_names_and_orientation(saved, quant):
    cfg, params, _ = _model(quant)
    t = load_file(saved(quant) / "model.safetensors")
    np.testing.assert_array_equal(t["model.layers.0.self_attn.q_a_proj.weight"],
                                  np.asarray(params["layers_0"]["self_attn"]["q_a_proj"]["kernel"]).T)
    np.testing.assert_array_equal(t["model.embed_tokens.weight"],
                                  np.asarray(params["embed_tokens"]["embedding"]))
    assert t["model.layers.1.mlp.gate.e_score_correction_bias"].dtype == np.float32
    hf = moe.experts_to_hf(params["layers_1"]["mlp"]["experts"])
    base = "model.layers.1.mlp.experts.3.down_proj."
    if quant == "int4":
        np.testing.assert_array_equal(t[base + "weight_packed"], np.asarray(hf["down_packed"][3]))
        np.testing.assert_array_equal(t[base + "weight_shape"], [cfg.hidden_size, cfg.moe_intermediate_size])
        assert t[base + "weight_scale"].dtype == jnp.bfloat16
    else:
        np.testing.assert_array_equal(t[base + "weight"], np.asarray(hf["down"][3]))
    assert not any(k.startswith("model.layers.0.mlp.experts") for k in t)


def test_bf16_params_round_trip(tmp_path):
    cfg = _cfg("int4")
    params = random_params(cfg, jnp.bfloat16, seed=1)
    save_target_hf(tmp_path, cfg, params, max_shard_bytes=100_000)
    cfg2, params2 = load_target(tmp_path)  # default dtype: bfloat16
    like_init(cfg, params2, jnp.bfloat16)
    assert_identical(params, params2)


def test_int4_scales_load_as_float16(saved, tmp_path):
    """load_target(scale_dtype="float16"): the experts' scales on the device in float16 holding the
    bf16 values exactly (float32 logits unchanged, bit for bit), and saving writes the same bf16
    tensors back."""
    cfg, params, logits = _model("int4")
    cfg16, params16 = load_target(saved("int4"), dtype=jnp.float32, scale_dtype="float16")
    assert cfg16 == dataclasses.replace(cfg, quant=QuantConfig("int4", 32, "float16"))
    like_init(cfg16, params16, jnp.float32)
    experts = params16["layers_1"]["mlp"]["experts"]
    assert {experts[k].dtype for k in experts if k.endswith("qscale")} == {jnp.dtype(jnp.float16)}
    np.testing.assert_array_equal(np.asarray(target_logits(params16, cfg16, TOKENS)), logits)
    save_target_hf(tmp_path, cfg16, params16)
    a, b = (load_file(p / "model.safetensors") for p in (saved("int4"), tmp_path))
    assert a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]) for k in a)
    with pytest.raises(ConfigError, match="quant.scale_dtype must be"):
        load_target(saved("int4"), scale_dtype="float32")


def test_float32_checkpoint_loads_as_bf16(saved):
    cfg, params, _ = _model("bf16")
    _, params2 = load_target(saved("bf16"), dtype=jnp.bfloat16)
    like_init(cfg, params2, jnp.bfloat16)     # every leaf bf16 but the float32 router bias
    assert params2["layers_1"]["mlp"]["gate"]["e_score_correction_bias"].dtype == jnp.float32
    # every value: the float32 one rounded to the leaf's dtype (the bias unrounded)
    assert_identical(jax.tree.map(lambda a, b: a.astype(b.dtype), params, params2), params2)


def test_plain_q_proj_and_tied_embeddings(tmp_path):
    cfg = ModelConfig.preset("tiny", q_lora_rank=None, tie_word_embeddings=True)
    params = random_params(cfg, jnp.float32, seed=2)
    params["lm_head"]["kernel"] = params["embed_tokens"]["embedding"].T
    save_target_hf(tmp_path / "a", cfg, params)
    assert "model.layers.0.self_attn.q_proj.weight" in load_file(tmp_path / "a" / "model.safetensors")
    _copy(tmp_path / "a", tmp_path / "b", edit_tensors=lambda t: t.pop("lm_head.weight"))
    cfg2, params2 = load_target(tmp_path / "b", dtype=jnp.float32)
    assert cfg2 == cfg
    assert_identical(params, params2)


def test_known_unused_tensors_are_ignored(saved, tmp_path):
    def add(t):
        t["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(4, np.float32)
        t["model.layers.3.mlp.gate.weight"] = np.zeros((16, 64), np.float32)   # the MTP layer
    _copy(saved("bf16"), tmp_path, add, lambda c: c.update(num_nextn_predict_layers=1))
    assert_identical(_model("bf16")[1], load_target(tmp_path, dtype=jnp.float32)[1])


def test_multimodal_tensors_are_ignored_under_the_prefix(tmp_path):
    cfg, params, _ = _model("int4")
    save_target_hf(tmp_path, cfg, params, max_shard_bytes=40_000, prefix=LM)
    vision = {"vision_tower.patch_embed.proj.weight": np.zeros((8, 3), np.float32),
              "mm_projector.proj.0.weight": np.zeros((4, 4), np.float32)}
    save_file(vision, tmp_path / "vision.safetensors")
    with open(tmp_path / "model.safetensors.index.json") as f:
        index = json.load(f)
    index["weight_map"].update({k: "vision.safetensors" for k in vision})
    with open(tmp_path / "model.safetensors.index.json", "w") as f:
        json.dump(index, f)
    assert_identical(params, load_target(tmp_path, dtype=jnp.float32)[1])


@pytest.mark.parametrize("quant, dtype", [("bf16", jnp.float32), ("int4", jnp.bfloat16)])
def test_orbax_round_trip_bit_exact(tmp_path, quant, dtype):
    cfg = _cfg(quant)
    params = random_params(cfg, dtype, seed=3)
    save_checkpoint(tmp_path, cfg, params)
    assert os.path.exists(tmp_path / "int4_layout.json") == (quant == "int4")
    cfg2, params2 = restore_checkpoint(tmp_path)
    assert cfg2 == cfg
    assert_identical(params, params2)


def test_orbax_refuses_int4_experts_of_another_layout(tmp_path):
    """INT4 experts are saved in the kernels' layout: a checkpoint without the layout marker (read
    as layout 1) or with another version is refused, not misread."""
    cfg = _cfg("int4")
    save_checkpoint(tmp_path, cfg, random_params(cfg, jnp.bfloat16, seed=4))
    os.remove(tmp_path / "int4_layout.json")
    with pytest.raises(CheckpointError, match="kernel layout version 1, this code reads version 2"):
        restore_checkpoint(tmp_path)
    (tmp_path / "int4_layout.json").write_text(json.dumps({"int4_kernel_layout": 3}))
    with pytest.raises(CheckpointError, match="kernel layout version 3"):
        restore_checkpoint(tmp_path)


# ---- bad input -----------------------------------------------------------------------------

def _expect(path, exc, match):
    with pytest.raises(exc, match=match):
        load_target(path, dtype=jnp.float32)


def _edited(saved, quant, tmp_path, edit_tensors=None, edit_config=None):
    return _copy(saved(quant), tmp_path, edit_tensors, edit_config)


def test_missing_tensor(saved, tmp_path):
    _edited(saved, "bf16", tmp_path, lambda t: t.pop("model.layers.0.self_attn.kv_b_proj.weight"))
    _expect(tmp_path, CheckpointError, r"missing tensor\(s\): model\.layers\.0\.self_attn\.kv_b_proj\.weight")


@pytest.mark.parametrize("quant, field", [("bf16", "weight"), ("int4", "weight_scale")])
def test_missing_expert_tensor(saved, tmp_path, quant, field):
    name = f"model.layers.2.mlp.experts.5.up_proj.{field}"
    _edited(saved, quant, tmp_path, lambda t: t.pop(name))
    _expect(tmp_path, CheckpointError, r"missing tensor\(s\): " + name.replace(".", r"\."))


@pytest.mark.parametrize("name", ["model.layers.0.self_attn.extra.weight",
                                  "model.layers.3.mlp.gate.weight",      # MTP layer, not declared
                                  "vision_tower.x.weight"],              # without the prefix scheme
                         ids=["extra", "mtp", "vision"])
def test_extra_tensor(saved, tmp_path, name):
    _edited(saved, "bf16", tmp_path, lambda t: t.update({name: np.zeros(2, np.float32)}))
    _expect(tmp_path, CheckpointError, r"unexpected tensor\(s\): " + name.replace(".", r"\."))


def test_wrong_shape(saved, tmp_path):
    name = "model.layers.1.self_attn.q_a_proj.weight"
    _edited(saved, "bf16", tmp_path, lambda t: t.update({name: np.zeros((47, 64), np.float32)}))
    _expect(tmp_path, CheckpointError, rf"{name}.*shape \[47, 64\], expected \[48, 64\]")


@pytest.mark.parametrize("quant, name, dtype, code", [
    ("bf16", "model.norm.weight", np.int32, "I32"),
    ("int4", "model.layers.1.mlp.experts.0.gate_proj.weight_packed", np.int64, "I64"),
    ("int4", "model.layers.1.mlp.experts.0.gate_proj.weight_scale", np.float32, "F32"),
], ids=["norm", "packed", "scale"])
def test_wrong_dtype(saved, tmp_path, quant, name, dtype, code):
    _edited(saved, quant, tmp_path, lambda t: t.update({name: t[name].astype(dtype)}))
    _expect(tmp_path, CheckpointError, rf"{name}.*dtype {code}")


def test_weight_shape_disagrees_with_config(saved, tmp_path):
    name = "model.layers.2.mlp.experts.7.down_proj.weight_shape"
    _edited(saved, "int4", tmp_path, lambda t: t.update({name: np.array([64, 64], np.int64)}))
    _expect(tmp_path, CheckpointError, rf"{name}.*\[64, 64\] disagrees with config.json: expected \[64, 32\]")


def test_int4_config_over_bf16_experts(saved, tmp_path):
    q = _cfg("int4").to_hf()["quantization_config"]
    _edited(saved, "bf16", tmp_path, edit_config=lambda c: c.update(quantization_config=q))
    _expect(tmp_path, CheckpointError, "quantization_config declares INT4 experts")


@pytest.mark.parametrize("edit, match", [
    (lambda q: q.update(format="float-quantized"), "format"),
    (lambda q: q.update(quant_method="fp8"), "quant_method"),
    (lambda q: q["config_groups"]["group_0"]["weights"].update(group_size=128), "group_size"),
    (lambda q: q["config_groups"]["group_0"]["weights"].update(num_bits=8), "4-bit"),
], ids=["format", "method", "group_size", "bits"])
def test_unsupported_quantization(saved, tmp_path, edit, match):
    _edited(saved, "int4", tmp_path, edit_config=lambda c: edit(c["quantization_config"]))
    _expect(tmp_path, ConfigError, match)


@pytest.mark.parametrize("fields, match", [
    ({"num_experts_per_tok": 32}, "num_experts_per_tok=32 exceeds n_routed_experts=16"),
    ({"first_k_dense_replace": 5}, "first_k_dense_replace=5"),
    ({"topk_group": 8}, "topk_group=8 exceeds n_group=4"),
])
def test_contradictory_config(saved, tmp_path, fields, match):
    _edited(saved, "bf16", tmp_path, edit_config=lambda c: c.update(fields))
    _expect(tmp_path, ConfigError, match)


def test_missing_files(saved, tmp_path):
    cfg, params, _ = _model("bf16")
    _expect(tmp_path, CheckpointError, "config.json not found")
    shutil.copy(saved("bf16") / "config.json", tmp_path / "config.json")
    _expect(tmp_path, CheckpointError, "no model.safetensors or model.safetensors.index.json")
    save_target_hf(tmp_path / "s", cfg, params, max_shard_bytes=40_000)
    shard = sorted(f for f in os.listdir(tmp_path / "s") if f.endswith(".safetensors"))[1]
    os.remove(tmp_path / "s" / shard)
    _expect(tmp_path / "s", CheckpointError, f"not found.*{shard}")


def test_writers_reject_params_of_another_config(tmp_path):
    cfg, params, _ = _model("bf16")
    other = cfg.replace(num_hidden_layers=2)
    with pytest.raises(CheckpointError, match="unexpected leaves.*layers_2"):
        save_target_hf(tmp_path / "hf", other, params)
    with pytest.raises(CheckpointError, match="unexpected leaves.*layers_2"):
        save_checkpoint(tmp_path / "orbax", other, params)
