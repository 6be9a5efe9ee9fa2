"""ModelConfig / DrafterConfig: presets, HF config.json parsing, validation messages."""

import json

import pytest

import ddtree_jax as dj
from ddtree_jax.config import ConfigError

# The text config of a Kimi-K2-style checkpoint, as published (fields the model reads plus a few extra).
K2_JSON = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "vocab_size": 163840,
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "num_hidden_layers": 61, "num_nextn_predict_layers": 0, "num_attention_heads": 64,
    "num_key_value_heads": 64, "n_shared_experts": 1, "n_routed_experts": 384, "ep_size": 1,
    "routed_scaling_factor": 2.827, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "qk_nope_head_dim": 128, "topk_method": "noaux_tc", "n_group": 1, "topk_group": 1,
    "num_experts_per_tok": 8, "moe_layer_freq": 1, "first_k_dense_replace": 1, "norm_topk_prob": True,
    "scoring_func": "sigmoid", "aux_loss_alpha": 0.001, "seq_aux": True, "hidden_act": "silu",
    "max_position_embeddings": 262144, "initializer_range": 0.02, "rms_norm_eps": 1e-05,
    "use_cache": True, "bos_token_id": 163584, "eos_token_id": 163586, "tie_word_embeddings": False,
    "rope_theta": 50000.0, "attention_bias": False, "attention_dropout": 0.0,
    "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 64.0, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"},
    "quantization_config": {
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None,
                                      "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                                  "strategy": "group", "group_size": 32}}},
        "ignore": ["lm_head"]},
}


def test_from_hf_equals_preset():
    assert dj.ModelConfig.from_hf(K2_JSON) == dj.ModelConfig.preset("kimi_k2_6")


def test_from_hf_nested_text_config_and_directory(tmp_path):
    wrapped = {"model_type": "kimi_k25", "text_config": {k: v for k, v in K2_JSON.items()
                                                        if k != "quantization_config"},
               "quantization_config": K2_JSON["quantization_config"], "vision_config": {}}
    (tmp_path / "config.json").write_text(json.dumps(wrapped))
    assert dj.ModelConfig.from_hf(tmp_path) == dj.ModelConfig.preset("kimi_k2_6")


@pytest.mark.parametrize("name", ["tiny", "k2_slice", "kimi_k2_6"])
def test_to_hf_round_trip(name):
    cfg = dj.ModelConfig.preset(name)
    assert dj.ModelConfig.from_hf(json.loads(json.dumps(cfg.to_hf()))) == cfg


def test_presets():
    k2 = dj.ModelConfig.preset("kimi_k2_6")
    sl = dj.ModelConfig.preset("k2_slice")
    assert (k2.num_hidden_layers, k2.latent_dim, k2.qk_head_dim) == (61, 576, 192)
    assert sl.hidden_size == k2.hidden_size and sl.n_routed_experts == 384
    assert not sl.is_moe_layer(0) and all(sl.is_moe_layer(i) for i in range(1, sl.num_hidden_layers))
    tiny = dj.ModelConfig.preset("tiny")
    assert 8 <= tiny.n_routed_experts <= 16 and tiny.n_group > 1
    # softmax scale: qk_head_dim^-0.5 * mscale(64, 1)^2
    import math
    m = 0.1 * math.log(64) + 1
    assert abs(k2.softmax_scale - 192 ** -0.5 * m * m) < 1e-12


@pytest.mark.parametrize("change, match", [
    ({"num_experts_per_tok": 500}, "num_experts_per_tok"),
    ({"n_group": 5}, "n_group"),
    ({"topk_group": 9, "n_group": 8}, "topk_group"),
    ({"first_k_dense_replace": 99}, "first_k_dense_replace"),
    ({"qk_rope_head_dim": 63}, "qk_rope_head_dim"),
    ({"hidden_size": 0}, "hidden_size"),
    ({"scoring_func": "softmax"}, "scoring_func"),
])
def test_contradictions_are_named(change, match):
    with pytest.raises(ConfigError, match=match):
        dj.ModelConfig.from_hf({**K2_JSON, **change})


def test_missing_field_and_bad_quant():
    d = dict(K2_JSON)
    del d["kv_lora_rank"]
    with pytest.raises(ConfigError, match="kv_lora_rank"):
        dj.ModelConfig.from_hf(d)
    for q, match in [({"format": "float-quantized"}, "format"),
                     ({"quant_method": "gptq"}, "quant_method")]:
        with pytest.raises(ConfigError, match=match):
            dj.ModelConfig.from_hf({**K2_JSON, "quantization_config": {**K2_JSON["quantization_config"], **q}})
    groups = {"group_0": {"weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                      "strategy": "group", "group_size": 128}}}
    with pytest.raises(ConfigError, match="group_size"):
        dj.ModelConfig.from_hf({**K2_JSON, "quantization_config": {
            **K2_JSON["quantization_config"], "config_groups": groups}})
    with pytest.raises(ConfigError, match="preset"):
        dj.ModelConfig.preset("huge")


def test_drafter_config():
    tgt = dj.ModelConfig.preset("kimi_k2_6")
    d = dj.DrafterConfig.for_target(tgt)
    d.check_target(tgt)
    assert all(0 <= i < 61 for i in d.target_layer_ids) and d.block_size == 16
    with pytest.raises(ConfigError, match="block_size"):
        d.replace(block_size=1)
    with pytest.raises(ConfigError, match="target_layer_ids"):
        d.replace(target_layer_ids=(0, 61))
    with pytest.raises(ConfigError, match="hidden_size"):
        d.check_target(dj.ModelConfig.preset("tiny"))


@pytest.mark.parametrize("change, match", [
    ({"q_lora_rank": 1.5}, r"q_lora_rank must be >= 1 and an int, got 1.5"),
    ({"num_hidden_layers": True}, r"num_hidden_layers must be >= 1 and an int, got True"),
    ({"n_shared_experts": 1.0}, r"n_shared_experts must be >= 0 and an int"),
    ({"first_k_dense_replace": 0.5}, r"first_k_dense_replace must be >= 0 and an int"),
    ({"bos_token_id": 1.0}, r"bos_token_id must be >= 0 and an int"),
    ({"eos_token_id": (2, 3.5)}, r"eos_token_id must be >= 0 and an int, got 3.5"),
])
def test_model_config_integer_fields_refuse_floats_and_bools(change, match):
    with pytest.raises(ConfigError, match=match):
        dj.ModelConfig.preset("tiny", **change)


def test_nested_integer_fields_refuse_floats():
    with pytest.raises(ConfigError,
                       match=r"rope_scaling.original_max_position_embeddings must be >= 1 and an int"):
        dj.RopeScaling(factor=8.0, original_max_position_embeddings=64.0)
    with pytest.raises(ConfigError, match=r"quant.group_size must be >= 1 and an int, got 32.0"):
        dj.QuantConfig("int4", 32.0)


@pytest.mark.parametrize("override, match", [
    ({"block_size": 2.5}, r"drafter block_size must be >= 2 and an int, got 2.5"),
    ({"num_hidden_layers": True}, r"drafter num_hidden_layers must be >= 1 and an int, got True"),
    ({"mask_token_id": 1.5}, r"drafter mask_token_id must be >= 0 and an int, got 1.5"),
    ({"max_position_embeddings": 4096.0}, r"drafter max_position_embeddings must be >= 1 and an int"),
    ({"target_layer_ids": (1.5,)}, r"drafter target_layer_ids entry must be >= 0 and an int, got 1.5"),
])
def test_drafter_config_integer_fields_refuse_floats_and_bools(override, match):
    with pytest.raises(ConfigError, match=match):
        dj.DrafterConfig.for_target(dj.ModelConfig.preset("tiny"), **override)
