"""Loaders refuse what they do not understand, naming the file and the field, tensor or argument;
writers replace a checkpoint whole or not at all."""

import json
import os
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import ddtree_jax as dj
from ddtree_jax.checkpoint import (CheckpointError, load_target, restore_checkpoint, save_checkpoint,
                                   save_target_hf)
from ddtree_jax.config import ConfigError, DrafterConfig, ModelConfig, QuantConfig, RopeScaling
from ddtree_jax.drafter import init_drafter
from ddtree_jax.drafter_io import DrafterCheckpointError, load_drafter, save_drafter
from ddtree_jax.safetensors_io import INDEX, PENDING, SINGLE
from tests.io_testing import assert_identical, random_params

TINY = ModelConfig.preset("tiny")
LFS = "version https://git-lfs.github.com/spec/v1\noid sha256:4d7a\nsize 1234\n"


def _named(path, pattern: str) -> str:
    """A regex: the file's path, then `pattern`."""
    return re.escape(os.fspath(path)) + ".*" + pattern


# ---- target config.json -------------------------------------------------------------------

def _v5(**rope):
    """An edit writing transformers 5's spelling: rope_parameters (updated by `rope`; None
    removes a key) in place of rope_theta + rope_scaling."""
    def edit(d):
        spec = {"rope_type": "yarn", "rope_theta": d.pop("rope_theta"), **d.pop("rope_scaling")}
        del spec["type"]
        spec.update(rope)
        d["rope_parameters"] = {k: v for k, v in spec.items() if v is not None}
    return edit


def _set(**kw):
    return lambda d: d.update(kw)


def _quant(edit):
    def apply(d):
        d["quantization_config"] = TINY.replace(quant=QuantConfig("int4")).to_hf()["quantization_config"]
        edit(d["quantization_config"], d["quantization_config"]["config_groups"]["group_0"])
    return apply


def _wrapped(edit):
    """The K2.5 / K2.6 form (text_config), then `edit` on the whole dict."""
    def apply(d):
        text = dict(d)
        d.clear()
        d.update(model_type="kimi_k25", architectures=["KimiK25ForConditionalGeneration"], text_config=text)
        edit(d)
    return apply


@pytest.mark.parametrize("edit, pattern", [
    (_set(norm_topk_prob="false"), r"norm_topk_prob must be true or false, got 'false'"),
    (_set(norm_topk_prob=1), r"norm_topk_prob must be true or false, got 1"),
    (_set(tie_word_embeddings="no"), r"tie_word_embeddings must be true or false, got 'no'"),
    (_set(attention_bias=0), r"attention_bias must be true or false, got 0"),
    (_set(hidden_size="64"), r"hidden_size must be >= 1 and an int, got '64'"),
    (_set(num_hidden_layers=3.0), r"num_hidden_layers must be >= 1 and an int, got 3\.0"),
    (_set(vocab_size=True), r"vocab_size must be >= 1 and an int, got True"),
    (_set(q_lora_rank="48"), r"q_lora_rank must be >= 1 and an int, got '48'"),
    (_set(rms_norm_eps="1e-6"), r"rms_norm_eps must be a finite number > 0\.0, got '1e-6'"),
    (_set(rms_norm_eps=float("nan")), r"rms_norm_eps must be a finite number > 0\.0, got nan"),
    (_set(routed_scaling_factor=-1.0), r"routed_scaling_factor must be a finite number > 0\.0"),
    (_set(routed_scaling_factor=True), r"routed_scaling_factor must be a finite number > 0\.0, got True"),
    (_set(rope_theta="50000"), r"rope_theta must be a finite number > 0\.0, got '50000'"),
    (_set(eos_token_id=512), r"eos_token_id=512 lies outside the vocabulary \[0, vocab_size=512\)"),
    (_set(eos_token_id=[2, 600]), r"eos_token_id=600 lies outside the vocabulary"),
    (_set(bos_token_id=9999), r"bos_token_id=9999 lies outside the vocabulary"),
    (_set(eos_token_id="2"), r"eos_token_id must be >= 0 and an int, got '2'"),
    (_set(model_type="llama"), r"model_type='llama': not a model this loader reads \(known: \['deepseek_v3', 'kimi_k2'\]\)"),
    (lambda d: d.pop("model_type"), r"model_type=None: not a model this loader reads"),
    (_set(model_type="deepseek_v32"), r"model_type='deepseek_v32'"),
    (_set(architectures=["LlamaForCausalLM"]), r"architectures='LlamaForCausalLM': .*known: \['DeepseekV3ForCausalLM'\]"),
    (_set(architectures="DeepseekV3ForCausalLM"), r"architectures must be a list of class names"),
    (_set(rope_interleave=False), r"rope_interleave=False: only interleaved rope pairs"),
    (_set(num_nextn_predict_layers="1"), r"num_nextn_predict_layers must be >= 0 and an int, got '1'"),
    (_set(rope_scaling="yarn"), r"rope_scaling must be an object or null, got 'yarn'"),
    (lambda d: d["rope_scaling"].update(type="linear"), r"rope_scaling\.rope_type='linear' is not implemented"),
    (lambda d: d["rope_scaling"].pop("type"), r"rope_scaling\.rope_type=None is not implemented"),
    (lambda d: d["rope_scaling"].update(rope_type="dynamic"), r"rope_scaling: rope_type and type disagree"),
    (lambda d: d["rope_scaling"].update(type=["yarn"]), r"rope_scaling\.rope_type must be a string, got \[\['yarn'\]\]"),
    (_v5(rope_type="longrope"), r"rope_parameters\.rope_type='longrope' is not implemented"),
    (_v5(low_freq_factor=1.0), r"rope_parameters: unknown key\(s\) \['low_freq_factor'\]"),
    (_v5(factor="8"), r"rope_parameters\.factor must be a finite number >= 1\.0, got '8'"),
    (_v5(original_max_position_embeddings=None), r"rope_parameters: yarn needs \['original_max_position_embeddings'\]"),
    (_v5(original_max_position_embeddings=64.5), r"rope_parameters\.original_max_position_embeddings must be >= 1 and an int"),
    (_v5(truncate=False), r"rope_parameters\.truncate=False: only true"),
    (_v5(attention_factor=1.2), r"rope_parameters\.attention_factor=1\.2"),
    (_v5(partial_rotary_factor=0.5), r"rope_parameters\.partial_rotary_factor=0\.5"),
    (_v5(mscale=None), r"rope_parameters: mscale=None with mscale_all_dim=1\.0 gives transformers' attention factor"),
    (_v5(beta_fast=0.0), r"rope_parameters\.beta_fast must be a finite number > 0\.0, got 0\.0"),
    (lambda d: (_v5()(d), d.update(rope_theta=10000.0)), r"rope_parameters\.rope_theta and rope_theta disagree"),
    (lambda d: d.update(rope_parameters={"rope_type": "default", "factor": 8.0}),
     r"rope_parameters: rope_type 'default' with scaling key\(s\) \['factor'\]"),
    (lambda d: d.update(rope_parameters={**d["rope_scaling"], "rope_type": "yarn", "type": "yarn",
                                         "factor": 4.0}), r"rope_scaling and rope_parameters disagree"),
    (_quant(lambda q, g: g.update(input_activations={"num_bits": 8})),
     r"quantization_config\.config_groups\.group_0\.input_activations: only weight-only"),
    (_quant(lambda q, g: g["weights"].update(group_size="32")),
     r"quantization_config\.config_groups\.group_0\.weights\.group_size must be >= 1 and an int, got '32'"),
    (_quant(lambda q, g: g["weights"].update(actorder="group")), r"weights\.actorder='group' is not implemented"),
    (_quant(lambda q, g: g["weights"].update(symmetric=False)), r"weights\.symmetric: only true"),
    (_quant(lambda q, g: q.update(kv_cache_scheme={"num_bits": 8})), r"quantization_config\.kv_cache_scheme="),
    (_quant(lambda q, g: q.update(config_groups=[g])), r"quantization_config\.config_groups: expected one group"),
    (_wrapped(lambda d: d["text_config"].update(model_type="qwen3")), r"text_config\.model_type='qwen3'"),
    (_wrapped(_set(architectures=["Qwen2VLForConditionalGeneration"])), r"architectures='Qwen2VLForConditionalGeneration'"),
    (_wrapped(_set(model_type="llava")), r"model_type='llava': .*known: \['kimi_k25'\]"),
    (_wrapped(_set(text_config=None)), r"text_config must be an object, got None"),
    (_wrapped(lambda d: (d.update(quantization_config={"quant_method": "fp8"}),
                         d["text_config"].update(quantization_config={"quant_method": "awq"}))),
     r"quantization_config and text_config\.quantization_config disagree"),
], ids=lambda v: None if callable(v) else re.sub(r"\W+", "-", v)[:40])
def test_model_config_json_names_the_field_and_the_file(tmp_path, edit, pattern):
    _assert_refused(tmp_path, ModelConfig, TINY, edit, pattern)


def _assert_refused(tmp_path, cls, config, edit, pattern):
    """config's config.json, changed by `edit`, is refused by cls.from_hf naming the file and
    the `pattern`."""
    d = json.loads(json.dumps(config.to_hf()))
    edit(d)
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(ConfigError, match=_named(tmp_path / "config.json", pattern)):
        cls.from_hf(tmp_path)


def test_rope_spellings_and_default_rope_type():
    d = TINY.to_hf()
    v5 = json.loads(json.dumps(d))
    _v5()(v5)
    assert ModelConfig.from_hf(v5) == ModelConfig.from_hf(d) == TINY
    both = dict(d, rope_parameters=v5["rope_parameters"])
    assert ModelConfig.from_hf(both) == TINY
    plain = {k: v for k, v in d.items() if k not in ("rope_scaling", "rope_theta")}
    cfg = ModelConfig.from_hf(dict(plain, rope_parameters={"rope_type": "default", "rope_theta": 5e5}))
    assert (cfg.rope_theta, cfg.rope_scaling) == (5e5, None)
    assert isinstance(ModelConfig.from_hf(dict(d, rope_theta=50000)).rope_theta, float)


@pytest.mark.parametrize("field, value, pattern", [
    ("routed_scaling_factor", "2.5", r"routed_scaling_factor must be a finite number > 0\.0, got '2\.5'"),
    ("norm_topk_prob", "false", r"norm_topk_prob must be true or false"),
    ("rope_scaling", {"factor": 8.0}, r"rope_scaling must be None or a RopeScaling"),
    ("quant", "int4", r"quant must be a QuantConfig"),
])
def test_model_config_constructor_checks_types(field, value, pattern):
    with pytest.raises(ConfigError, match=pattern):
        TINY.replace(**{field: value})


def test_rope_scaling_checks_types():
    with pytest.raises(ConfigError, match=r"rope_scaling\.beta_fast must be a finite number > 0\.0, got '32'"):
        RopeScaling(factor=8.0, original_max_position_embeddings=64, beta_fast="32")
    with pytest.raises(ConfigError, match=r"rope_scaling\.mscale must be a finite number, got inf"):
        RopeScaling(factor=8.0, original_max_position_embeddings=64, mscale=float("inf"))


# ---- drafter config.json ------------------------------------------------------------------

DRAFTER = DrafterConfig.for_target(TINY, block_size=4)


@pytest.mark.parametrize("edit, pattern", [
    (_set(rms_norm_eps="1e-6"), r"drafter rms_norm_eps must be a finite number > 0\.0, got '1e-6'"),
    (_set(model_type="llama"), r"model_type='llama': not a model this loader reads \(known: \['qwen3'\]\)"),
    (_set(architectures=["Qwen3ForCausalLM"]), r"architectures='Qwen3ForCausalLM'"),
    (_set(rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
     r"rope_parameters: rope scaling \(yarn\) is not implemented"),
    (_set(rope_parameters={"rope_type": "default", "rope_theta": 5e5}),
     r"rope_parameters\.rope_theta and rope_theta disagree"),
    (_set(dflash_config=[1, 2]), r"dflash_config must be an object, got \[1, 2\]"),
    (lambda d: d["dflash_config"].update(target_layer_ids="1,2"), r"drafter target_layer_ids must be a list"),
    (_set(layer_types="full_attention"), r"layer_types must be a list"),
    (_set(use_sliding_window="false"), r"use_sliding_window must be true or false"),
    (_set(num_target_layers="3"), r"drafter num_target_layers must be >= 1 and an int, got '3'"),
    (_set(max_position_embeddings=4096.0), r"drafter max_position_embeddings must be >= 1 and an int"),
], ids=lambda v: None if callable(v) else re.sub(r"\W+", "-", v)[:40])
def test_drafter_config_json_names_the_field_and_the_file(tmp_path, edit, pattern):
    _assert_refused(tmp_path, DrafterConfig, DRAFTER, edit, pattern)


# ---- damaged files ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(params, a single-file and a sharded float32 HF checkpoint of the tiny target)."""
    root = tmp_path_factory.mktemp("saved")
    params = random_params(TINY, jnp.float32, seed=5)
    save_target_hf(root / "single", TINY, params)
    save_target_hf(root / "sharded", TINY, params, max_shard_bytes=40_000)
    return params, root / "single", root / "sharded"


def _copy(src, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    return dst


def _first_shard(path) -> str:
    return sorted(f for f in os.listdir(path) if f.startswith("model-"))[0]


@pytest.mark.parametrize("layout, damage, file, exc, pattern", [
    ("single", lambda p: (p / "config.json").write_text("{'vocab_size': 512,"), "config.json",
     CheckpointError, r": not valid JSON"),
    ("single", lambda p: (p / "config.json").write_text("[1, 2]"), "config.json",
     CheckpointError, r": expected a JSON object, got list"),
    ("single", lambda p: (p / "config.json").write_text(LFS), "config.json",
     CheckpointError, r": not valid JSON \(a Git LFS pointer file"),
    ("sharded", lambda p: (p / INDEX).write_text('{"weight_map": {'), INDEX, CheckpointError, r": not valid JSON"),
    ("sharded", lambda p: (p / INDEX).write_text(json.dumps({"weight_map": {"model.norm.weight": "../x.safetensors"}})),
     INDEX, CheckpointError, r": weight_map entries must name \.safetensors files .* model\.norm\.weight"),
    ("sharded", lambda p: (p / INDEX).write_text(json.dumps({"weight_map": {"model.norm.weight": 3}})),
     INDEX, CheckpointError, r": weight_map entries .* bad entries for model\.norm\.weight"),
    ("single", lambda p: os.truncate(p / SINGLE, os.path.getsize(p / SINGLE) // 2), SINGLE,
     CheckpointError, r": not a complete safetensors file"),
    ("single", lambda p: (p / SINGLE).write_text(LFS), SINGLE, CheckpointError, r" is a Git LFS pointer file"),
    ("sharded", lambda p: (p / _first_shard(p)).write_text(LFS), "model-00001-of-", CheckpointError,
     r"\d{5}\.safetensors is a Git LFS pointer file"),
    ("sharded", lambda p: (p / _first_shard(p)).write_bytes(b"\x08"), "model-00001-of-", CheckpointError,
     r"\d{5}\.safetensors: not a complete safetensors file"),
    ("single", lambda p: (p / PENDING).write_text("{}"), PENDING, CheckpointError, r": a save into .* did not finish"),
], ids=["config-not-json", "config-list", "config-lfs", "index-not-json", "index-escapes", "index-not-str",
        "truncated", "lfs", "lfs-shard", "short-shard", "pending"])
def test_damaged_target_files_are_named(saved, tmp_path, layout, damage, file, exc, pattern):
    path = _copy(saved[1] if layout == "single" else saved[2], tmp_path)
    damage(path)
    with pytest.raises(exc, match=re.escape(str(path / file)) + pattern):
        load_target(path, jnp.float32)


def test_both_layouts_in_one_directory_are_refused(saved, tmp_path):
    path = _copy(saved[2], tmp_path)
    shutil.copy(saved[1] / SINGLE, path / SINGLE)
    with pytest.raises(CheckpointError, match=f"{re.escape(str(path))} holds both {SINGLE} and {INDEX}"):
        load_target(path, jnp.float32)


@pytest.mark.parametrize("quant, name, value", [
    ("bf16", "model.layers.0.self_attn.kv_b_proj.weight", np.nan),
    ("bf16", "model.layers.2.mlp.experts.3.down_proj.weight", np.inf),
    ("int4", "model.layers.1.mlp.experts.0.up_proj.weight_scale", -np.inf),
])
def test_non_finite_weights_are_refused_by_name(saved, tmp_path, quant, name, value):
    if quant == "bf16":
        src = saved[1]
    else:
        src = tmp_path / "int4"
        cfg = TINY.replace(quant=QuantConfig("int4"))
        save_target_hf(src, cfg, random_params(cfg, jnp.bfloat16, seed=6))
    path = _copy(src, tmp_path)
    tensors = load_file(path / SINGLE)
    tensors[name] = tensors[name].copy()
    tensors[name].reshape(-1)[3] = value
    save_file(tensors, path / SINGLE)
    with pytest.raises(CheckpointError, match=rf"tensor '{re.escape(name)}' \(.*/{SINGLE}\) holds 1 NaN or Inf"):
        load_target(path, jnp.float32)
    if quant == "bf16":                 # opted out: the value is read as it is
        _, params = load_target(path, jnp.float32, check_finite=False)
        assert not all(bool(jnp.isfinite(x).all()) for x in jax.tree.leaves(params))
    else:                               # the kernels' layout refuses a non-finite scale anyway
        with pytest.raises(ValueError, match=r"up_scale: values outside"):
            load_target(path, jnp.float32, check_finite=False)


@pytest.fixture
def drafter_dir(tmp_path):
    params = init_drafter(DRAFTER, jax.random.key(3), jnp.float32)
    save_drafter(tmp_path / "d", DRAFTER, params)
    return tmp_path / "d"


@pytest.mark.parametrize("damage, exc, pattern", [
    (lambda p: (p / "config.json").write_text("not json"), ConfigError, r"config\.json: not valid JSON"),
    (lambda p: (p / SINGLE).write_text(LFS), DrafterCheckpointError, rf"{SINGLE} is a Git LFS pointer file"),
    (lambda p: os.truncate(p / SINGLE, 100), DrafterCheckpointError, rf"{SINGLE}: not a complete safetensors file"),
    (lambda p: (shutil.copy(p / SINGLE, p / "model-00001-of-00001.safetensors"),
                (p / INDEX).write_text(json.dumps({"weight_map": {}}))),
     DrafterCheckpointError, f"holds both {SINGLE} and {INDEX}"),
    (lambda p: save_file({**load_file(p / SINGLE), "norm.weight": np.full(64, np.nan, np.float32)}, p / SINGLE),
     DrafterCheckpointError, r"tensor 'norm\.weight' \(.*/model\.safetensors\) holds 64 NaN or Inf"),
], ids=["config-not-json", "lfs", "truncated", "both-layouts", "nan"])
def test_damaged_drafter_files_are_named(drafter_dir, damage, exc, pattern):
    damage(drafter_dir)
    with pytest.raises(exc, match=re.escape(str(drafter_dir)) + ".*" + pattern):
        load_drafter(drafter_dir, jnp.float32)


# ---- writers ------------------------------------------------------------------------------

def test_resaving_replaces_every_weight_file_of_the_old_checkpoint(saved, tmp_path):
    """A sharded checkpoint saved over by a single file (and back): only the new set remains, and
    the files the save does not own stay."""
    params = saved[0]
    other = random_params(TINY, jnp.float32, seed=9)
    path = _copy(saved[2], tmp_path)
    (path / "tokenizer.json").write_text("{}")
    save_target_hf(path, TINY, other)
    assert sorted(os.listdir(path)) == ["config.json", SINGLE, "tokenizer.json"]
    assert_identical(load_target(path, jnp.float32)[1], other)
    save_target_hf(path, TINY, params, max_shard_bytes=60_000)
    assert SINGLE not in os.listdir(path) and INDEX in os.listdir(path)
    assert_identical(load_target(path, jnp.float32)[1], params)


@pytest.mark.parametrize("value", [0, -1, 1.5e6, "1GB"])
def test_save_target_hf_names_a_bad_shard_size(tmp_path, saved, value):
    with pytest.raises(ValueError, match=rf"max_shard_bytes must be a positive int or None, got {value!r}"):
        save_target_hf(tmp_path / "x", TINY, saved[0], max_shard_bytes=value)
    assert not (tmp_path / "x").exists() or not os.listdir(tmp_path / "x")


def test_orbax_save_refuses_an_existing_checkpoint_untouched_or_replaces_it_whole(saved, tmp_path):
    path = tmp_path / "orbax"
    save_checkpoint(path, TINY, saved[0])
    before = {f: (path / f).stat().st_mtime_ns for f in ("config.json", "params")}
    other_cfg = TINY.replace(eos_token_id=3)
    other = random_params(TINY, jnp.float32, seed=8)
    with pytest.raises(FileExistsError, match=rf"{re.escape(str(path))} already exists; pass overwrite=True"):
        save_checkpoint(path, other_cfg, other)
    assert {f: (path / f).stat().st_mtime_ns for f in before} == before
    assert restore_checkpoint(path)[0] == TINY
    save_checkpoint(path, other_cfg, other, overwrite=True)
    cfg, params = restore_checkpoint(path)
    assert cfg == other_cfg
    assert_identical(params, other)
    assert sorted(os.listdir(tmp_path)) == ["orbax"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError, match="file exists and is not a directory"):
        save_checkpoint(tmp_path / "file", TINY, saved[0], overwrite=True)


def test_orbax_restore_names_a_missing_metadata_file_and_non_finite_leaves(saved, tmp_path):
    params = jax.tree.map(lambda x: x, saved[0])
    params["norm"]["scale"] = params["norm"]["scale"].at[2].set(jnp.nan)
    save_checkpoint(tmp_path / "nan", TINY, params)
    with pytest.raises(CheckpointError, match=r"params\['norm'\]\['scale'\] holds NaN or Inf"):
        restore_checkpoint(tmp_path / "nan")
    assert bool(jnp.isnan(restore_checkpoint(tmp_path / "nan", check_finite=False)[1]["norm"]["scale"][2]))
    os.remove(tmp_path / "nan" / "params" / "_METADATA")
    with pytest.raises(CheckpointError, match=_named(tmp_path / "nan" / "params", "_METADATA file is missing")):
        restore_checkpoint(tmp_path / "nan")


def test_serve_names_a_target_that_is_not_a_pair(saved):
    with pytest.raises(ValueError, match=r"target must be a \(ModelConfig, params\) pair, as load_target "
                                         r"returns; got dict"):
        dj.serve(saved[0], None, [[1, 2]], streams=1, method="ar", max_new_tokens=2)
