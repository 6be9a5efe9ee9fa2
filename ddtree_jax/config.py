"""Model and drafter configurations: frozen dataclasses, presets.

`ModelConfig` carries every field of a DeepSeek-V3 / Kimi-K2 `config.json` that the forward
pass reads; `ModelConfig.from_hf` accepts the dict or the checkpoint directory (K2.5/K2.6 nest
the text model's config under `text_config`; the parsing lives in `ddtree_jax.hf_config`).
`DrafterConfig` describes a DFlash drafter. Every constructor checks each field's type and range
and raises `ConfigError` naming the offending field.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Mapping


class ConfigError(ValueError):
    """A configuration field is missing, out of range, or contradicts another field."""


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def _require_int(name: str, value, minimum: int) -> None:
    """ConfigError naming `name` unless `value` is a Python int >= minimum (bool excluded; no
    numpy integers either: configs are hashed as jit static arguments and written to config.json)."""
    _require(isinstance(value, int) and not isinstance(value, bool) and value >= minimum,
             f"{name} must be >= {minimum} and an int, got {value!r}")


def _require_float(name: str, value, above: float | None = None, at_least: float | None = None) -> float:
    """float(value), or ConfigError naming `name` unless `value` is a finite int or float (no bool,
    no string) > `above` / >= `at_least` where given."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (above is None or value > above) and (at_least is None or value >= at_least)
    bound = f" > {above}" if above is not None else f" >= {at_least}" if at_least is not None else ""
    _require(ok, f"{name} must be a finite number{bound}, got {value!r}")
    return float(value)


def _require_bool(name: str, value) -> None:
    _require(isinstance(value, bool), f"{name} must be true or false, got {value!r}")


def _floats(obj, prefix: str, bounds: dict[str, dict]) -> None:
    """Check each float field of a frozen dataclass (`bounds`: name -> _require_float's bounds)
    and store it as a Python float."""
    for name, kw in bounds.items():
        object.__setattr__(obj, name, _require_float(prefix + name, getattr(obj, name), **kw))


@dataclasses.dataclass(frozen=True)
class Kernels:
    """Which implementation each kernel operation runs (pallas_kernels.registry names; "auto": the
    registry's choice by backend and shape). One static value for the model and the engine.

    attn: the target's "mla_attention"; moe: "moe_experts"; topk: the tree's "topk" /
    "topk_logsumexp", "tree_search" and "tree_accept"; drafter_attn: the drafter's
    "drafter_qkv" and "drafter_attention"; attn_balance: mla_attention's schedule hint for streams
    of different context lengths (the same result either way; docs/kernels/mla_attention.md).
    """

    attn: str = "auto"
    moe: str = "auto"
    topk: str = "auto"
    drafter_attn: str = "auto"
    attn_balance: bool = True

    # the keyword arguments that name one field each (generate, serve, forward take them too)
    ALIASES = {"attn_impl": "attn", "moe_impl": "moe", "topk_impl": "topk",
               "drafter_attn_impl": "drafter_attn", "attn_balance": "attn_balance"}

    # the kernel operations each field picks the implementation of
    OPERATIONS = {"attn": ("mla_attention",), "moe": ("moe_experts",),
                  "topk": ("topk_logsumexp", "tree_search", "tree_accept"),
                  "drafter_attn": ("drafter_attention", "drafter_qkv")}

    def __post_init__(self):
        from pallas_kernels import registry
        for alias, f in self.ALIASES.items():
            value = getattr(self, f)
            if f == "attn_balance" or value == "auto":
                continue
            if value not in registry.IMPLS:
                raise ValueError(f"Kernels.{f} ({alias}) must be 'auto' or one of {registry.IMPLS}; "
                                 f"got {value!r}")
            for op in self.OPERATIONS[f]:
                try:
                    registry.resolve(op, value)
                except ValueError as e:
                    raise ValueError(f"{alias}={value!r}: {e}") from None
        if not isinstance(self.attn_balance, bool):
            raise ValueError(f"Kernels.attn_balance must be a bool; got {self.attn_balance!r}")

    @classmethod
    def of(cls, kernels: "Kernels | None" = None, **aliases) -> "Kernels":
        """`kernels` (default Kernels()) with the fields that keyword aliases (ALIASES, e.g.
        attn_impl="xla") name replaced; None values are ignored. TypeError for another keyword."""
        unknown = set(aliases) - set(cls.ALIASES)
        if unknown:
            raise TypeError(f"unknown kernel option(s) {sorted(unknown)}; expected {sorted(cls.ALIASES)}")
        if kernels is not None and not isinstance(kernels, Kernels):
            raise TypeError(f"kernels must be a Kernels; got {type(kernels).__name__}")
        changes = {cls.ALIASES[k]: v for k, v in aliases.items() if v is not None}
        return dataclasses.replace(kernels or cls(), **changes)


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """YaRN rope scaling (`rope_scaling` in config.json, type "yarn")."""

    factor: float = 1.0
    original_max_position_embeddings: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0
    type: str = "yarn"

    def __post_init__(self):
        _require(self.type in ("yarn", "deepseek_yarn"),
                 f"rope_scaling.type: only 'yarn' is supported, got {self.type!r}")
        _floats(self, "rope_scaling.", {"factor": dict(at_least=1.0), "beta_fast": dict(above=0.0),
                                        "beta_slow": dict(above=0.0), "mscale": {},
                                        "mscale_all_dim": dict(at_least=0.0)})
        _require_int("rope_scaling.original_max_position_embeddings",
                     self.original_max_position_embeddings, 1)


@dataclasses.dataclass(frozen=True)
class QuantConfig:
    """Routed-expert weight format: "bf16" (dense) or "int4" (compressed-tensors pack-quantized,
    symmetric, `group_size` along the input dimension). scale_dtype: the dtype int4 group scales
    are kept in on the device, "bfloat16" (as stored) or "float16" (the same values, converted
    exactly; the Pallas MoE kernels then multiply in float16, with about half the error:
    docs/kernels/moe.md, "Design")."""

    format: str = "bf16"
    group_size: int = 32
    scale_dtype: str = "bfloat16"

    def __post_init__(self):
        _require(self.format in ("bf16", "int4"),
                 f"quant.format must be 'bf16' or 'int4', got {self.format!r}")
        _require_int("quant.group_size", self.group_size, 1)
        _require(self.group_size in (32,) or self.format == "bf16",
                 f"quant.group_size: only 32 is supported for int4, got {self.group_size}")
        _require(self.scale_dtype in ("bfloat16", "float16"),
                 f"quant.scale_dtype must be 'bfloat16' or 'float16', got {self.scale_dtype!r}")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """DeepSeek-V3 / Kimi-K2 decoder (MLA attention, noaux_tc-routed MoE, YaRN RoPE)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int          # dense MLP (layers < first_k_dense_replace)
    moe_intermediate_size: int      # per routed / shared expert
    num_hidden_layers: int
    num_attention_heads: int
    q_lora_rank: int | None         # None: plain q_proj
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    n_routed_experts: int
    num_experts_per_tok: int
    n_shared_experts: int = 1
    first_k_dense_replace: int = 1
    moe_layer_freq: int = 1
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    norm_topk_prob: bool = True
    scoring_func: str = "sigmoid"
    topk_method: str = "noaux_tc"
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    quant: QuantConfig = QuantConfig()

    def __post_init__(self):
        pos = ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
               "num_hidden_layers", "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim",
               "qk_rope_head_dim", "v_head_dim", "n_routed_experts", "num_experts_per_tok",
               "n_group", "topk_group", "moe_layer_freq", "max_position_embeddings")
        for name in pos:
            _require_int(name, getattr(self, name), 1)
        if self.q_lora_rank is not None:
            _require_int("q_lora_rank", self.q_lora_rank, 1)
        _require_int("n_shared_experts", self.n_shared_experts, 0)
        _require_int("first_k_dense_replace", self.first_k_dense_replace, 0)
        _floats(self, "", {"routed_scaling_factor": dict(above=0.0), "rms_norm_eps": dict(above=0.0),
                           "rope_theta": dict(above=0.0)})
        for name in ("norm_topk_prob", "tie_word_embeddings", "attention_bias"):
            _require_bool(name, getattr(self, name))
        _require(self.rope_scaling is None or isinstance(self.rope_scaling, RopeScaling),
                 f"rope_scaling must be None or a RopeScaling, got {self.rope_scaling!r}")
        _require(isinstance(self.quant, QuantConfig), f"quant must be a QuantConfig, got {self.quant!r}")
        ids = {"bos_token_id": () if self.bos_token_id is None else (self.bos_token_id,),
               "eos_token_id": (self.eos_token_id if isinstance(self.eos_token_id, tuple)
                                else () if self.eos_token_id is None else (self.eos_token_id,))}
        for name, values in ids.items():
            for t in values:
                _require_int(name, t, 0)
                _require(t < self.vocab_size,
                         f"{name}={t} lies outside the vocabulary [0, vocab_size={self.vocab_size})")
        _require(self.first_k_dense_replace <= self.num_hidden_layers,
                 f"first_k_dense_replace={self.first_k_dense_replace} must lie in "
                 f"[0, num_hidden_layers={self.num_hidden_layers}]")
        _require(self.qk_rope_head_dim % 2 == 0,
                 f"qk_rope_head_dim must be even (pairs rotate), got {self.qk_rope_head_dim}")
        _require(self.num_experts_per_tok <= self.n_routed_experts,
                 f"num_experts_per_tok={self.num_experts_per_tok} exceeds "
                 f"n_routed_experts={self.n_routed_experts}")
        _require(self.n_routed_experts % self.n_group == 0,
                 f"n_routed_experts={self.n_routed_experts} is not divisible by n_group={self.n_group}")
        _require(self.topk_group <= self.n_group,
                 f"topk_group={self.topk_group} exceeds n_group={self.n_group}")
        per_group = self.n_routed_experts // self.n_group
        _require(self.n_group == 1 or per_group >= 2,
                 "group-limited routing needs >= 2 experts per group (the group score sums the top 2)")
        _require(self.n_group == 1 or self.topk_group * per_group >= self.num_experts_per_tok,
                 f"topk_group={self.topk_group} groups of {per_group} experts cannot hold "
                 f"num_experts_per_tok={self.num_experts_per_tok}")
        _require(self.scoring_func == "sigmoid",
                 f"scoring_func: only 'sigmoid' is supported, got {self.scoring_func!r}")
        _require(self.topk_method == "noaux_tc",
                 f"topk_method: only 'noaux_tc' is supported, got {self.topk_method!r}")
        _require(self.hidden_act == "silu", f"hidden_act: only 'silu' is supported, got {self.hidden_act!r}")
        _require(not self.attention_bias, "attention_bias=True is not supported")
        if self.quant.format == "int4":
            g = self.quant.group_size
            _require(self.hidden_size % g == 0 and self.moe_intermediate_size % g == 0,
                     f"int4 experts need hidden_size ({self.hidden_size}) and moe_intermediate_size "
                     f"({self.moe_intermediate_size}) divisible by group_size {g}")

    # ---- derived sizes -------------------------------------------------------------------
    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_dim(self) -> int:
        """Per-token, per-layer latent cache width: kv_lora_rank + qk_rope_head_dim."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def is_moe_layer(self, i: int) -> bool:
        return i >= self.first_k_dense_replace and i % self.moe_layer_freq == 0

    @property
    def softmax_scale(self) -> float:
        """qk_head_dim**-0.5, times mscale(factor, mscale_all_dim)**2 under YaRN."""
        scale = self.qk_head_dim ** -0.5
        rs = self.rope_scaling
        if rs is not None and rs.mscale_all_dim:
            m = yarn_mscale(rs.factor, rs.mscale_all_dim)
            scale *= m * m
        return scale

    def replace(self, **kw) -> "ModelConfig":
        return dataclasses.replace(self, **kw)

    # ---- HF config.json ------------------------------------------------------------------
    @classmethod
    def from_hf(cls, src: Mapping[str, Any] | str | os.PathLike) -> "ModelConfig":
        """Parse a DeepSeek-V3 / Kimi-K2 config.json (dict, file or checkpoint directory); K2.5 /
        K2.6 nest it under `text_config`. RoPE in either spelling (rope_theta + rope_scaling, or
        transformers 5's rope_parameters); every field's type and range, model_type and
        architectures are checked (ddtree_jax.hf_config), a ConfigError names the file."""
        from ddtree_jax import hf_config
        return hf_config.model_config(*hf_config.load(src))

    def to_hf(self) -> dict:
        """The config.json dict (DeepSeek-V3 naming) that `from_hf` reads back to an equal config."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
             if f.name not in ("rope_scaling", "quant")}
        d["model_type"] = "kimi_k2"
        d["architectures"] = ["DeepseekV3ForCausalLM"]
        if isinstance(d["eos_token_id"], tuple):
            d["eos_token_id"] = list(d["eos_token_id"])
        d["rope_scaling"] = dataclasses.asdict(self.rope_scaling) if self.rope_scaling else None
        if self.quant.format == "int4":
            d["quantization_config"] = {
                "quant_method": "compressed-tensors",
                "format": "pack-quantized",
                "config_groups": {"group_0": {
                    "targets": ["Linear"],
                    "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                "strategy": "group", "group_size": self.quant.group_size},
                    "input_activations": None}},
                "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                           "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
            }
        return d

    # ---- presets -------------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str, **overrides) -> "ModelConfig":
        """"tiny" (CPU tests), "k2_slice" (real K2.6 dims, 4 layers), "kimi_k2_6" (full)."""
        _require(name in _PRESETS, f"unknown preset {name!r}; choose from {sorted(_PRESETS)}")
        return dataclasses.replace(_PRESETS[name], **overrides)


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN attention magnitude correction: 0.1 * mscale * ln(scale) + 1 (1 when scale <= 1)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


@dataclasses.dataclass(frozen=True)
class DrafterConfig:
    """DFlash block-diffusion drafter: Qwen3-style layers over [fused target taps ; block].

    The drafter shares the target's embedding and lm_head; `hidden_size` and `vocab_size` must
    equal the target's. `target_layer_ids` are 0-based target decoder layers whose outputs are
    tapped, as transformers' `hidden_states[i + 1]` (the last layer's after the final norm; the
    reference's default spacing when built with `for_target`).
    """

    hidden_size: int
    vocab_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int
    block_size: int = 16
    mask_token_id: int = 0
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40960

    def __post_init__(self):
        for name in ("hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "intermediate_size", "num_target_layers"):
            _require_int(f"drafter {name}", getattr(self, name), 1)
        _require_int("drafter max_position_embeddings", self.max_position_embeddings, 1)
        _require_int("drafter block_size", self.block_size, 2)
        _require_int("drafter mask_token_id", self.mask_token_id, 0)
        _require(self.mask_token_id < self.vocab_size,
                 f"drafter mask_token_id={self.mask_token_id} outside vocab [0, {self.vocab_size})")
        _require(self.num_attention_heads % self.num_key_value_heads == 0,
                 f"drafter num_attention_heads={self.num_attention_heads} not divisible by "
                 f"num_key_value_heads={self.num_key_value_heads}")
        _require(isinstance(self.target_layer_ids, (tuple, list)),
                 f"drafter target_layer_ids must be a list of layer indices, got {self.target_layer_ids!r}")
        _require(len(self.target_layer_ids) >= 1, "drafter target_layer_ids is empty")
        for i in self.target_layer_ids:
            _require_int("drafter target_layer_ids entry", i, 0)
        bad = [i for i in self.target_layer_ids if not i < self.num_target_layers]
        _require(not bad, f"drafter target_layer_ids {bad} out of range [0, {self.num_target_layers})")
        _require(self.head_dim % 2 == 0, "drafter head_dim must be even")
        _floats(self, "drafter ", {"rms_norm_eps": dict(above=0.0), "rope_theta": dict(above=0.0)})
        object.__setattr__(self, "target_layer_ids", tuple(self.target_layer_ids))

    def replace(self, **kw) -> "DrafterConfig":
        return dataclasses.replace(self, **kw)

    @classmethod
    def from_hf(cls, src: Mapping[str, Any] | str | os.PathLike) -> "DrafterConfig":
        """Parse a z-lab DFlash config.json (dict, file or checkpoint directory).

        Qwen3-style top level plus `dflash_config`; as in the reference, a key in `dflash_config`
        (target_layer_ids, mask_token_id, block_size, num_target_layers) wins over the top level,
        and target_layer_ids default to the reference spacing. RoPE in either spelling; variants
        this drafter does not implement (DFlash2, sliding-window or causal layers, rope scaling,
        logit transforms) and unknown model types raise ConfigError naming the file.
        """
        from ddtree_jax import hf_config
        return hf_config.drafter_config(*hf_config.load(src))

    def to_hf(self) -> dict:
        """The z-lab config.json dict (DFlashDraftModel) that `from_hf` reads back to an equal config."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
             if f.name not in ("target_layer_ids", "mask_token_id")}
        d.update(architectures=["DFlashDraftModel"], model_type="qwen3", hidden_act="silu",
                 attention_bias=False, tie_word_embeddings=False,
                 dflash_config={"block_size": self.block_size, "mask_token_id": self.mask_token_id,
                                "target_layer_ids": list(self.target_layer_ids)})
        return d

    @classmethod
    def for_target(cls, target: ModelConfig, **overrides) -> "DrafterConfig":
        """A drafter sized and tapped for `target` (defaults follow the DFlash reference)."""
        n_layers = overrides.pop("num_hidden_layers", 1 if target.hidden_size < 1024 else 5)
        heads = overrides.pop("num_attention_heads", max(1, target.hidden_size // 128)
                              if target.hidden_size >= 1024 else 4)
        kw = dict(
            hidden_size=target.hidden_size,
            vocab_size=target.vocab_size,
            num_hidden_layers=n_layers,
            num_attention_heads=heads,
            num_key_value_heads=max(1, heads // 4) if heads >= 4 else heads,
            head_dim=128 if target.hidden_size >= 1024 else max(8, target.hidden_size // heads),
            intermediate_size=3 * target.hidden_size,
            target_layer_ids=default_target_layer_ids(target.num_hidden_layers, n_layers),
            num_target_layers=target.num_hidden_layers,
            rms_norm_eps=target.rms_norm_eps,
        )
        kw.update(overrides)
        return cls(**kw)

    def check_target(self, target: ModelConfig) -> None:
        """Raise ConfigError if this drafter cannot run on `target`."""
        _require(self.hidden_size == target.hidden_size,
                 f"drafter hidden_size={self.hidden_size} != target hidden_size={target.hidden_size}")
        _require(self.vocab_size == target.vocab_size,
                 f"drafter vocab_size={self.vocab_size} != target vocab_size={target.vocab_size}")
        _require(self.num_target_layers == target.num_hidden_layers,
                 f"drafter num_target_layers={self.num_target_layers} != target "
                 f"num_hidden_layers={target.num_hidden_layers}")


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """DFlash reference spacing: evenly from layer 1 to num_target_layers - 3 (middle for one)."""
    if num_draft_layers == 1 or num_target_layers < 4:
        return (num_target_layers // 2,)
    start, end = 1, num_target_layers - 3
    return tuple(int(round(start + i * (end - start) / (num_draft_layers - 1)))
                 for i in range(num_draft_layers))


_K2_6 = ModelConfig(
    vocab_size=163840, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
    num_hidden_layers=61, num_attention_heads=64, q_lora_rank=1536, kv_lora_rank=512,
    qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=384,
    num_experts_per_tok=8, n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1,
    routed_scaling_factor=2.827, norm_topk_prob=True, rms_norm_eps=1e-5, rope_theta=50000.0,
    rope_scaling=RopeScaling(factor=64.0, original_max_position_embeddings=4096, beta_fast=1.0,
                             beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0),
    max_position_embeddings=262144, bos_token_id=163584, eos_token_id=163586,
    quant=QuantConfig("int4", 32),
)

_PRESETS = {
    "kimi_k2_6": _K2_6,
    "k2_slice": dataclasses.replace(_K2_6, num_hidden_layers=4),
    "tiny": ModelConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=3, num_attention_heads=4, q_lora_rank=48, kv_lora_rank=32,
        qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=16,
        num_experts_per_tok=4, n_shared_experts=1, first_k_dense_replace=1, n_group=4,
        topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True, rms_norm_eps=1e-6,
        rope_theta=50000.0,
        rope_scaling=RopeScaling(factor=8.0, original_max_position_embeddings=64, beta_fast=32.0,
                                 beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0),
        max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
    ),
}
