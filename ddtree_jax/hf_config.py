"""Hugging Face config.json -> ModelConfig / DrafterConfig, refusing what the models do not implement.

RoPE is read in both spellings: `rope_theta` + `rope_scaling` (DeepSeek's, transformers 4) and
`rope_parameters` (transformers 5), rope_type "default" (no scaling) or "yarn"; where both
spellings are given they must agree. Every field is checked for its type and range, model_type
and architectures must be ones listed here, and a ConfigError raised while reading a file names it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from typing import Any, Mapping

from ddtree_jax.config import (ConfigError, DrafterConfig, ModelConfig, QuantConfig, RopeScaling,
                               _require, _require_bool, _require_float, _require_int,
                               default_target_layer_ids, yarn_mscale)
from ddtree_jax.safetensors_io import read_json

TEXT_MODEL_TYPES = ("deepseek_v3", "kimi_k2")
TEXT_ARCHITECTURES = ("DeepseekV3ForCausalLM",)
WRAPPER_MODEL_TYPES = ("kimi_k25",)            # K2.5 / K2.6: the text model under text_config
WRAPPER_ARCHITECTURES = ("KimiK25ForConditionalGeneration", "Kimi_K25ForConditionalGeneration")
DRAFTER_MODEL_TYPES = ("qwen3",)
DRAFTER_ARCHITECTURES = ("DFlashDraftModel",)

YARN_TYPES = ("yarn", "deepseek_yarn")
_YARN_KEYS = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
              "mscale_all_dim", "truncate", "attention_factor")
_ROPE_KEYS = ("rope_type", "type", "rope_theta", "partial_rotary_factor") + _YARN_KEYS


def load(src: Mapping[str, Any] | str | os.PathLike) -> tuple[dict, str]:
    """(the config dict, its file's path or "" for a dict) from a dict, a config.json file or a
    checkpoint directory; ConfigError naming the file when it is missing or not a JSON object."""
    if isinstance(src, Mapping):
        return dict(src), ""
    path = os.fspath(src)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if not os.path.isfile(path):
        raise ConfigError(f"config.json not found at {path}")
    return read_json(path, "config.json", ConfigError), path


@contextlib.contextmanager
def naming(where: str):
    """Prefix a ConfigError raised inside with `where` (a file's path)."""
    try:
        yield
    except ConfigError as e:
        if not where:
            raise
        raise ConfigError(f"{where}: {e}") from None


def _known(field: str, value, known: tuple[str, ...]) -> None:
    _require(value in known, f"{field}={value!r}: not a model this loader reads (known: {list(known)})")


def _known_architectures(field: str, archs, known: tuple[str, ...]) -> None:
    if archs is None:
        return
    _require(isinstance(archs, list) and all(isinstance(a, str) for a in archs),
             f"{field} must be a list of class names, got {archs!r}")
    for a in archs:
        _known(field, a, known)


def text_config(d: Mapping[str, Any]) -> dict:
    """The text model's config: `d` itself, or (K2.5 / K2.6) its text_config with the top level's
    quantization_config; model_type and architectures checked at both levels."""
    if "text_config" in d or d.get("model_type") in WRAPPER_MODEL_TYPES:
        _known("model_type", d.get("model_type"), WRAPPER_MODEL_TYPES)
        _known_architectures("architectures", d.get("architectures"), WRAPPER_ARCHITECTURES)
        text = d.get("text_config")
        _require(isinstance(text, Mapping), f"text_config must be an object, got {text!r}")
        text = dict(text)
        if text.get("model_type") is not None:
            _known("text_config.model_type", text["model_type"], TEXT_MODEL_TYPES)
        _known_architectures("text_config.architectures", text.get("architectures"), TEXT_ARCHITECTURES)
        outer = d.get("quantization_config")
        if outer is not None:
            _require(text.get("quantization_config") in (None, outer),
                     "quantization_config and text_config.quantization_config disagree")
            text["quantization_config"] = outer
        return text
    _known("model_type", d.get("model_type"), TEXT_MODEL_TYPES)
    _known_architectures("architectures", d.get("architectures"), TEXT_ARCHITECTURES)
    return dict(d)


# ---- RoPE ----------------------------------------------------------------------------------

def _rope_spec(field: str, spec: Mapping[str, Any], scaling_ok: bool):
    """(rope_theta or None, RopeScaling or None) from one rope_scaling / rope_parameters object."""
    unknown = sorted(set(spec) - set(_ROPE_KEYS))
    _require(not unknown, f"{field}: unknown key(s) {unknown} (this model reads {list(_ROPE_KEYS)})")
    given = [spec[k] for k in ("rope_type", "type") if k in spec]
    _require(all(isinstance(k, str) for k in given), f"{field}.rope_type must be a string, got {given}")
    kinds = set(given)
    _require(len(kinds) <= 1, f"{field}: rope_type and type disagree ({sorted(kinds)})")
    kind = next(iter(kinds), "default" if field == "rope_parameters" else None)
    _require(kind in ("default",) + YARN_TYPES,
             f"{field}.rope_type={kind!r} is not implemented (only 'default', no scaling, and 'yarn')")
    prf = spec.get("partial_rotary_factor", 1.0)
    _require(prf == 1.0 and not isinstance(prf, bool),
             f"{field}.partial_rotary_factor={prf!r}: only 1.0 (every rope dim rotates) is implemented")
    if kind == "default":
        stray = [k for k in _YARN_KEYS if k in spec]
        _require(not stray, f"{field}: rope_type 'default' with scaling key(s) {stray}")
        return spec.get("rope_theta"), None
    _require(scaling_ok, f"{field}: rope scaling ({kind}) is not implemented by this model")
    _require(spec.get("truncate", True) is True,
             f"{field}.truncate={spec.get('truncate')!r}: only true (a rounded correction range) is implemented")
    _require(spec.get("attention_factor") is None,
             f"{field}.attention_factor={spec.get('attention_factor')!r}: only the factor that mscale "
             "and mscale_all_dim give is implemented")
    missing = [k for k in ("factor", "original_max_position_embeddings") if spec.get(k) is None]
    _require(not missing, f"{field}: yarn needs {missing}")
    m, mad = spec.get("mscale"), spec.get("mscale_all_dim")
    try:
        rs = RopeScaling(factor=spec["factor"],
                         original_max_position_embeddings=spec["original_max_position_embeddings"],
                         beta_fast=32.0 if spec.get("beta_fast") is None else spec["beta_fast"],
                         beta_slow=1.0 if spec.get("beta_slow") is None else spec["beta_slow"],
                         mscale=1.0 if m is None else m, mscale_all_dim=0.0 if mad is None else mad,
                         type=kind)
    except ConfigError as e:
        raise ConfigError(str(e).replace("rope_scaling.", f"{field}.")) from None
    # transformers drops mscale / mscale_all_dim unless both are nonzero; DeepSeek's reference
    # defaults them to 1 / 0: refuse where the two attention factors differ
    f = rs.factor
    hf = yarn_mscale(f, m) / yarn_mscale(f, mad) if (m and mad) else yarn_mscale(f)
    ref = yarn_mscale(f, rs.mscale) / yarn_mscale(f, rs.mscale_all_dim)
    _require(math.isclose(hf, ref, rel_tol=1e-12),
             f"{field}: mscale={m!r} with mscale_all_dim={mad!r} gives transformers' attention factor "
             f"{hf:.6g} but DeepSeek's {ref:.6g}; give both")
    return spec.get("rope_theta"), rs


def rope(d: Mapping[str, Any], scaling_ok: bool = True, default_theta: float = 10000.0):
    """(rope_theta, RopeScaling or None) from either spelling (module docstring)."""
    found = {}
    for field in ("rope_scaling", "rope_parameters"):
        spec = d.get(field)
        if spec is not None:
            _require(isinstance(spec, Mapping), f"{field} must be an object or null, got {spec!r}")
            found[field] = _rope_spec(field, spec, scaling_ok)
    thetas = {f"{k}.rope_theta": t for k, (t, _) in found.items() if t is not None}
    if d.get("rope_theta") is not None:
        thetas["rope_theta"] = d["rope_theta"]
    thetas = {k: _require_float(k, t, above=0.0) for k, t in thetas.items()}
    _require(len(set(thetas.values())) <= 1, f"{' and '.join(thetas)} disagree: {thetas}")
    scalings = [s for _, s in found.values()]
    if len(scalings) == 2 and scalings[0] != scalings[1]:
        raise ConfigError(f"rope_scaling and rope_parameters disagree: {scalings[0]} vs {scalings[1]}")
    return next(iter(thetas.values()), float(default_theta)), (scalings[0] if scalings else None)


# ---- quantization --------------------------------------------------------------------------

def quant(q: Mapping[str, Any] | None) -> QuantConfig:
    """QuantConfig of a compressed-tensors quantization_config (None: unquantized experts)."""
    if q is None:
        return QuantConfig("bf16")
    _require(isinstance(q, Mapping), f"quantization_config must be an object, got {q!r}")
    method = q.get("quant_method")
    _require(method == "compressed-tensors",
             f"quantization_config.quant_method: only 'compressed-tensors' is supported, got {method!r}")
    fmt = q.get("format")
    _require(fmt == "pack-quantized",
             f"quantization_config.format: only 'pack-quantized' is supported, got {fmt!r}")
    for key in ("kv_cache_scheme", "sparsity_config", "transform_config"):
        _require(not q.get(key), f"quantization_config.{key}={q.get(key)!r} is not implemented")
    groups = q.get("config_groups")
    _require(isinstance(groups, Mapping) and len(groups) == 1,
             f"quantization_config.config_groups: expected one group, got {groups!r}")
    name, group = next(iter(groups.items()))
    where = f"quantization_config.config_groups.{name}"
    _require(isinstance(group, Mapping), f"{where} must be an object, got {group!r}")
    for key in ("input_activations", "output_activations"):
        _require(group.get(key) is None, f"{where}.{key}: only weight-only quantization is implemented")
    _require(group.get("format") in (None, "pack-quantized"),
             f"{where}.format: only 'pack-quantized' is supported, got {group.get('format')!r}")
    w = group.get("weights")
    _require(isinstance(w, Mapping), f"{where}.weights must be an object, got {w!r}")
    _require(w.get("num_bits") == 4 and not isinstance(w.get("num_bits"), bool) and w.get("type", "int") == "int",
             f"{where}.weights: only 4-bit int is supported, got num_bits={w.get('num_bits')!r}, "
             f"type={w.get('type')!r}")
    _require(w.get("symmetric", True) is True, f"{where}.weights.symmetric: only true is supported")
    _require(w.get("strategy") == "group",
             f"{where}.weights.strategy: only 'group' is supported, got {w.get('strategy')!r}")
    for key in ("dynamic", "actorder", "block_structure"):
        _require(not w.get(key), f"{where}.weights.{key}={w.get(key)!r} is not implemented")
    _require_int(f"{where}.weights.group_size", w.get("group_size"), 1)
    try:
        return QuantConfig("int4", w["group_size"])
    except ConfigError as e:
        raise ConfigError(f"{where}.weights: {e}") from None


# ---- the two configs -----------------------------------------------------------------------

def model_config(raw: Mapping[str, Any], where: str = "") -> ModelConfig:
    """ModelConfig of a DeepSeek-V3 / Kimi-K2 (or K2.5 / K2.6 wrapper) config.json dict; `where`
    (its file) prefixes every ConfigError."""
    with naming(where):
        d = text_config(raw)
        fields = dataclasses.fields(ModelConfig)
        missing = [f.name for f in fields if f.default is dataclasses.MISSING and f.name not in d]
        _require(not missing, f"config.json is missing required field(s): {missing}")
        _require(d.get("rope_interleave", True) is True,
                 f"rope_interleave={d.get('rope_interleave')!r}: only interleaved rope pairs are implemented")
        if d.get("num_nextn_predict_layers") is not None:
            _require_int("num_nextn_predict_layers", d["num_nextn_predict_layers"], 0)
        kw = {f.name: d[f.name] for f in fields
              if f.name in d and f.name not in ("rope_theta", "rope_scaling", "quant")}
        if isinstance(kw.get("eos_token_id"), list):
            kw["eos_token_id"] = tuple(kw["eos_token_id"])
        kw["rope_theta"], kw["rope_scaling"] = rope(d)
        kw["quant"] = quant(d.get("quantization_config"))
        return ModelConfig(**kw)


def _dflash_variant(d: Mapping[str, Any], dc: Mapping[str, Any]) -> None:
    """Refuse DFlash config.json features the drafter does not implement, naming them."""
    _require_int("drafter num_hidden_layers", d["num_hidden_layers"], 1)
    layer_types = d.get("layer_types") or []
    _require(isinstance(layer_types, list), f"layer_types must be a list, got {layer_types!r}")
    for key in ("use_sliding_window", "is_causal", "attention_bias"):
        if d.get(key) is not None:
            _require_bool(key, d[key])
    window_layers = d.get("max_window_layers") or 0
    _require_int("max_window_layers", window_layers, 0)
    sliding = any(t != "full_attention" for t in layer_types) or (
        not layer_types and d.get("use_sliding_window") and window_layers < d["num_hidden_layers"])
    g = dc.get
    problems = [
        (any("DFlash2" in a for a in d.get("architectures") or []), f"architectures={d.get('architectures')}"),
        ("selector_rank" in dc or "conv_kernel_size" in dc, "DFlash2 selector/convolutions"),
        (bool(sliding), f"sliding-window layers (layer_types={layer_types})"),
        (bool(d.get("is_causal") or g("causal")), "causal attention (is_causal / causal)"),
        (bool(d.get("attention_bias")), "attention_bias=True"),
        (d.get("hidden_act", "silu") != "silu", f"hidden_act={d.get('hidden_act')!r}"),
        (g("attention_mode", "gqa") not in ("gqa", "mha"), f"attention_mode={g('attention_mode')!r}"),
        (g("input_embedding_scale", 1.0) != 1.0, f"input_embedding_scale={g('input_embedding_scale')}"),
        (g("output_multiplier", 1.0) != 1.0, f"output_multiplier={g('output_multiplier')}"),
        (bool(g("final_logit_softcapping")), f"final_logit_softcapping={g('final_logit_softcapping')}"),
    ]
    bad = [what for hit, what in problems if hit]
    _require(not bad, f"unsupported DFlash drafter variant: {'; '.join(bad)}")


def drafter_config(d: Mapping[str, Any], where: str = "") -> DrafterConfig:
    """DrafterConfig of a z-lab DFlash config.json dict (DrafterConfig.from_hf); `where` (its file)
    prefixes every ConfigError."""
    with naming(where):
        if "DFlash2" not in str(d.get("architectures")):     # named as a variant below
            _known("model_type", d.get("model_type"), DRAFTER_MODEL_TYPES)
            _known_architectures("architectures", d.get("architectures"), DRAFTER_ARCHITECTURES)
        dc = d.get("dflash_config") or {}
        _require(isinstance(dc, Mapping), f"dflash_config must be an object, got {dc!r}")

        def get(key, default=None):
            return dc.get(key, d.get(key, default))

        required = ("hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "head_dim", "intermediate_size")
        missing = [k for k in required if k not in d]
        missing += [f"{k} (top level or dflash_config)" for k in ("num_target_layers", "mask_token_id")
                    if get(k) is None]
        _require(not missing, f"drafter config.json is missing required field(s): {missing}")
        _dflash_variant(d, dc)
        _require_int("drafter num_target_layers", get("num_target_layers"), 1)
        ids = get("target_layer_ids")
        if ids is None:
            ids = default_target_layer_ids(get("num_target_layers"), d["num_hidden_layers"])
        _require(isinstance(ids, (list, tuple)),
                 f"drafter target_layer_ids must be a list of layer indices, got {ids!r}")
        theta, _ = rope(d, scaling_ok=False)
        return DrafterConfig(**{k: d[k] for k in required},
                             target_layer_ids=tuple(ids),
                             num_target_layers=get("num_target_layers"),
                             block_size=get("block_size", 16),
                             mask_token_id=get("mask_token_id"),
                             rms_norm_eps=d.get("rms_norm_eps", 1e-6),
                             rope_theta=theta,
                             max_position_embeddings=d.get("max_position_embeddings", 32768))
