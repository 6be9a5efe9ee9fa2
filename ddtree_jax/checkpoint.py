"""Target checkpoints: HF safetensors (DeepSeek-V3 / Kimi-K2 names) and Orbax.

`load_target` reads config.json and the safetensors of an HF directory (single file or sharded
with an index; bf16 or compressed-tensors INT4 routed experts; K2.5/K2.6 `language_model.` prefix
and `text_config` nesting detected) into exactly the pytree `init_target` returns. It checks every
tensor name, shape, dtype and `weight_shape` value before reading any weight, then reads
one tensor at a time (one layer's stacked experts at most). `save_target_hf` writes the same
layout; `save_checkpoint` / `restore_checkpoint` keep (config, params) with Orbax.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from ddtree_jax import hf_config, sharding
from ddtree_jax.atomic_io import staged_directory, write_json
from ddtree_jax.config import ModelConfig
from ddtree_jax.model import init_target
from ddtree_jax.safetensors_io import (FLOAT_DTYPES, INT_DTYPES, CheckpointError, TensorReader,
                                       check_complete, listing, read_json, write_checkpoint)
from pallas_kernels import moe
from pallas_kernels.moe import int4

__all__ = ["CheckpointError", "load_target", "save_target_hf", "save_checkpoint",
           "restore_checkpoint", "check_params"]

LM_PREFIX = "language_model."
_MM_PREFIXES = ("vision_tower.", "mm_projector.", "multi_modal_projector.")  # K2.5/K2.6 multimodal
_PROJS = (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj"))
_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.")


@dataclasses.dataclass(frozen=True)
class _Entry:
    """One non-expert HF tensor: `kind` "linear" (torch [out, in] <-> kernel [in, out]),
    "plain" (norm scale, embedding) or "bias" (float32 router bias)."""

    name: str
    path: tuple[str, ...]
    shape: tuple[int, ...]
    kind: str


@dataclasses.dataclass(frozen=True)
class _Spec:
    shape: tuple[int, ...]
    dtypes: tuple[str, ...]
    value: tuple[int, ...] | None = None   # required contents (weight_shape)


def _entries(cfg: ModelConfig) -> list[_Entry]:
    """Non-expert tensors in file order."""
    d, h = cfg.hidden_size, cfg.num_attention_heads
    lin = lambda name, path, n_in, n_out: _Entry(name, path, (n_out, n_in), "linear")
    norm = lambda name, path, n: _Entry(name, path, (n,), "plain")
    out = [_Entry("model.embed_tokens.weight", ("embed_tokens", "embedding"),
                  (cfg.vocab_size, d), "plain")]
    for i in range(cfg.num_hidden_layers):
        hf, p = f"model.layers.{i}.", f"layers_{i}"
        a, pa = hf + "self_attn.", (p, "self_attn")
        out.append(norm(hf + "input_layernorm.weight", (p, "input_layernorm", "scale"), d))
        if cfg.q_lora_rank:
            out += [lin(a + "q_a_proj.weight", pa + ("q_a_proj", "kernel"), d, cfg.q_lora_rank),
                    norm(a + "q_a_layernorm.weight", pa + ("q_a_layernorm", "scale"), cfg.q_lora_rank),
                    lin(a + "q_b_proj.weight", pa + ("q_b_proj", "kernel"), cfg.q_lora_rank,
                        h * cfg.qk_head_dim)]
        else:
            out.append(lin(a + "q_proj.weight", pa + ("q_proj", "kernel"), d, h * cfg.qk_head_dim))
        out += [lin(a + "kv_a_proj_with_mqa.weight", pa + ("kv_a_proj_with_mqa", "kernel"), d,
                    cfg.latent_dim),
                norm(a + "kv_a_layernorm.weight", pa + ("kv_a_layernorm", "scale"), cfg.kv_lora_rank),
                lin(a + "kv_b_proj.weight", pa + ("kv_b_proj", "kernel"), cfg.kv_lora_rank,
                    h * (cfg.qk_nope_head_dim + cfg.v_head_dim)),
                lin(a + "o_proj.weight", pa + ("o_proj", "kernel"), h * cfg.v_head_dim, d),
                norm(hf + "post_attention_layernorm.weight", (p, "post_attention_layernorm", "scale"), d)]
        m, pm = hf + "mlp.", (p, "mlp")
        if cfg.is_moe_layer(i):
            e = cfg.n_routed_experts
            out += [lin(m + "gate.weight", pm + ("gate", "kernel"), d, e),
                    _Entry(m + "gate.e_score_correction_bias", pm + ("gate", "e_score_correction_bias"),
                           (e,), "bias")]
            if cfg.n_shared_experts:
                out += _swiglu(m + "shared_experts.", pm + ("shared_experts",), d,
                               cfg.n_shared_experts * cfg.moe_intermediate_size)
        else:
            out += _swiglu(m, pm, d, cfg.intermediate_size)
    out += [_Entry("model.norm.weight", ("norm", "scale"), (d,), "plain"),
            _Entry("lm_head.weight", ("lm_head", "kernel"), (cfg.vocab_size, d), "linear")]
    return out


def _swiglu(name, path, d, inner) -> list[_Entry]:
    return [_Entry(name + "gate_proj.weight", path + ("gate_proj", "kernel"), (inner, d), "linear"),
            _Entry(name + "up_proj.weight", path + ("up_proj", "kernel"), (inner, d), "linear"),
            _Entry(name + "down_proj.weight", path + ("down_proj", "kernel"), (d, inner), "linear")]


def _expert_shapes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """HF [out, in] shape of each routed-expert projection ("gate", "up", "down")."""
    d, i = cfg.hidden_size, cfg.moe_intermediate_size
    return {"gate": (i, d), "up": (i, d), "down": (d, i)}


def _expert_specs(cfg: ModelConfig, layer: int) -> dict[str, _Spec]:
    """Every routed-expert tensor of one MoE layer, HF name -> spec."""
    specs = {}
    for short, proj in _PROJS:
        n, k = _expert_shapes(cfg)[short]
        for j in range(cfg.n_routed_experts):
            base = f"model.layers.{layer}.mlp.experts.{j}.{proj}."
            if cfg.quant.format == "bf16":
                specs[base + "weight"] = _Spec((n, k), FLOAT_DTYPES)
            else:
                specs[base + "weight_packed"] = _Spec((n, k // 8), ("I32",))
                specs[base + "weight_scale"] = _Spec((n, k // cfg.quant.group_size), ("BF16",))
                specs[base + "weight_shape"] = _Spec((2,), INT_DTYPES, (n, k))
    return specs


def _all_specs(cfg: ModelConfig) -> dict[str, _Spec]:
    specs = {e.name: _Spec(e.shape, FLOAT_DTYPES) for e in _entries(cfg)}
    for i in range(cfg.num_hidden_layers):
        if cfg.is_moe_layer(i):
            specs.update(_expert_specs(cfg, i))
    return specs


# ---- loading -------------------------------------------------------------------------------

def _read_config(path: str) -> tuple[ModelConfig, dict]:
    """(config, the text model's raw config dict) from path/config.json."""
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise CheckpointError(f"config.json not found in {path}")
    raw = read_json(cfg_path, "config.json")
    return hf_config.model_config(raw, cfg_path), hf_config.text_config(raw)


def _is_ignored(name: str, cfg: ModelConfig, nextn: int) -> bool:
    """Tensors known to be unused: rotary buffers and the multi-token-prediction layers."""
    if name.endswith("rotary_emb.inv_freq"):
        return True
    m = _LAYER_RE.match(name)
    return m is not None and cfg.num_hidden_layers <= int(m.group(1)) < cfg.num_hidden_layers + nextn


def _check_names(reader: TensorReader, cfg: ModelConfig, specs: dict, prefix: str, nextn: int) -> None:
    present = reader.names
    ours = {n[len(prefix):] for n in present if n.startswith(prefix)}
    extra = {n for n in present - {prefix + n for n in ours} if not n.startswith(_MM_PREFIXES)}
    extra |= {prefix + n for n in ours - specs.keys() if not _is_ignored(n, cfg, nextn)}
    missing = {prefix + n for n in specs.keys() - ours}
    if cfg.tie_word_embeddings:
        missing.discard(prefix + "lm_head.weight")
    problems = []
    if missing:
        problems.append(f"missing tensor(s): {listing(missing)}")
    if extra:
        problems.append(f"unexpected tensor(s): {listing(extra)}")
    if not problems:
        return
    if cfg.quant.format == "int4" and any(n.endswith("_proj.weight") and ".experts." in n for n in extra):
        problems.append("config.json's quantization_config declares INT4 experts but the checkpoint "
                        "holds unquantized expert weights")
    if cfg.quant.format == "bf16" and any(n.endswith(".weight_packed") for n in extra):
        problems.append("the checkpoint holds INT4 experts (weight_packed) but config.json has no "
                        "compressed-tensors quantization_config")
    raise CheckpointError("; ".join(problems))


def _check_headers(reader: TensorReader, specs: dict, prefix: str) -> None:
    for name, spec in specs.items():
        full = prefix + name
        if full not in reader.names:  # a tied lm_head
            continue
        shape, dtype = reader.shape(full), reader.dtype(full)
        if shape != spec.shape:
            raise CheckpointError(f"tensor {full!r}: shape {list(shape)}, expected {list(spec.shape)}")
        if dtype not in spec.dtypes:
            raise CheckpointError(f"tensor {full!r}: dtype {dtype}, expected one of {list(spec.dtypes)}")
        if spec.value is not None:
            value = tuple(int(v) for v in reader.get(full))
            if value != spec.value:
                raise CheckpointError(f"tensor {full!r} = {list(value)} disagrees with config.json: "
                                      f"expected {list(spec.value)} ([out, in])")


def _set(tree: dict, path: tuple[str, ...], value) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _load_entry(reader: TensorReader, entry: _Entry, name: str, dtype, mesh):
    """One tensor in the params layout: on the default device, or placed in its shards of `mesh`."""
    dtype = jnp.float32 if entry.kind == "bias" else dtype
    if mesh is None:
        a = jnp.asarray(reader.get(name))
        return (a.T if entry.kind == "linear" else a).astype(dtype)
    a = np.asarray(reader.get(name))
    a = np.ascontiguousarray(a.T if entry.kind == "linear" else a).astype(dtype)
    return sharding.place(a, "/".join(entry.path), mesh)


def _load_experts(reader: TensorReader, cfg: ModelConfig, layer: int, prefix: str, dtype, mesh) -> dict:
    """Stack one layer's routed experts into [E, ...] arrays and convert to the kernel layout
    (with `mesh`: one expert shard at a time, each placed on its devices)."""
    e = cfg.n_routed_experts
    stacks = {}
    for short, proj in _PROJS:
        n, k = _expert_shapes(cfg)[short]
        base = lambda j: f"{prefix}model.layers.{layer}.mlp.experts.{j}.{proj}."
        if cfg.quant.format == "bf16":
            fields = (("", "weight", (n, k), np.dtype(dtype)),)
        else:
            fields = (("_packed", "weight_packed", (n, k // 8), np.dtype(np.int32)),
                      ("_scale", "weight_scale", (n, k // cfg.quant.group_size), np.dtype(jnp.bfloat16)))
        for key, suffix, shape, np_dtype in fields:
            buf = np.empty((e,) + shape, np_dtype)
            for j in range(e):
                buf[j] = reader.get(base(j) + suffix)
            stacks[short + key] = buf
    if cfg.quant.format == "bf16":
        names, prepare = ("gate", "up", "down"), moe.prepare_experts_bf16
    else:
        names = tuple(s + k for s, _ in _PROJS for k in ("_packed", "_scale"))
        prepare = functools.partial(moe.prepare_experts_int4, scale_dtype=jnp.dtype(cfg.quant.scale_dtype))
    if mesh is None:
        return prepare(*(stacks[n] for n in names))
    return sharding.place_experts(prepare, [stacks[n] for n in names],
                                  f"layers_{layer}/mlp/experts", mesh)


def load_target(path: str | os.PathLike, dtype=jnp.bfloat16, *,
                mesh: jax.sharding.Mesh | None = None,
                scale_dtype: str = "bfloat16", check_finite: bool = True) -> tuple[ModelConfig, dict]:
    """HF directory (config.json + safetensors) -> (ModelConfig, params), params exactly as
    `init_target(cfg, key, dtype)` lays them out. Raises ConfigError / CheckpointError naming the
    file, field or tensor at fault; names, shapes, dtypes and weight_shape values are all checked
    before any weight is read, and (check_finite) every float tensor as it is read for NaN / Inf.
    With `mesh`, each tensor is placed in its shards by the sharding rules as it is read (a device
    receives only its slice). scale_dtype: the int4 experts' group scales on the device
    (QuantConfig.scale_dtype; "float16" raises ValueError on a scale that would not convert
    exactly)."""
    path = os.fspath(path)
    check_complete(path)
    cfg, text = _read_config(path)
    cfg = dataclasses.replace(cfg, quant=dataclasses.replace(cfg.quant, scale_dtype=scale_dtype))
    nextn = text.get("num_nextn_predict_layers") or 0
    specs = _all_specs(cfg)
    with TensorReader(path, check_finite) as reader:
        prefix = LM_PREFIX if any(n.startswith(LM_PREFIX) for n in reader.names) else ""
        _check_names(reader, cfg, specs, prefix, nextn)
        _check_headers(reader, specs, prefix)
        params: dict = {}
        for entry in _entries(cfg):
            name = prefix + entry.name
            if name not in reader.names:  # tied lm_head: the embedding, [V, d] like lm_head.weight
                name = prefix + "model.embed_tokens.weight"
            _set(params, entry.path, _load_entry(reader, entry, name, dtype, mesh))
        for i in range(cfg.num_hidden_layers):
            if cfg.is_moe_layer(i):
                _set(params, (f"layers_{i}", "mlp", "experts"), _load_experts(reader, cfg, i, prefix, dtype,
                                                                                mesh))
    check_params(cfg, params)
    return cfg, params


def check_params(cfg: ModelConfig, params) -> None:
    """Raise CheckpointError unless `params` has init_target's tree, shapes and dtypes for `cfg`
    (the param dtype is read from the embedding)."""
    emb = params.get("embed_tokens", {}).get("embedding") if isinstance(params, dict) else None
    if emb is None:
        raise CheckpointError("params: no embed_tokens/embedding leaf")
    want, got = _expected_leaves(cfg, np.dtype(emb.dtype)), _leaves(params)
    if want.keys() != got.keys():
        raise CheckpointError(f"params: missing leaves {listing(want.keys() - got.keys())}; "
                              f"unexpected leaves {listing(got.keys() - want.keys())}")
    for k, (shape, dt) in want.items():
        if got[k] != (shape, dt):
            raise CheckpointError(f"params{k}: {got[k][1]} {list(got[k][0])}, expected {dt} {list(shape)}")


def _leaves(tree) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    return {jax.tree_util.keystr(k): (tuple(v.shape), np.dtype(v.dtype))
            for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


@functools.lru_cache(maxsize=8)
def _expected_leaves(cfg: ModelConfig, dtype: np.dtype):
    return _leaves(jax.eval_shape(functools.partial(init_target, cfg, dtype=dtype), jax.random.key(0)))


# ---- writing -------------------------------------------------------------------------------

def _get(tree, path):
    for key in path:
        tree = tree[key]
    return tree


def _hf_tensors(cfg: ModelConfig, params, prefix: str):
    """(name, numpy array) pairs in HF orientation and file order, one layer's experts at a time."""
    for entry in _entries(cfg):
        a = np.asarray(_get(params, entry.path))
        yield prefix + entry.name, a.T if entry.kind == "linear" else a
        if entry.kind != "bias":  # the router bias: one per MoE layer, then that layer's experts
            continue
        layer = int(entry.path[0].removeprefix("layers_"))
        experts = moe.experts_to_hf(params[entry.path[0]]["mlp"]["experts"])
        hf = {k: np.asarray(v) for k, v in experts.items()}
        for short, proj in _PROJS:
            for j in range(cfg.n_routed_experts):
                base = f"{prefix}model.layers.{layer}.mlp.experts.{j}.{proj}."
                if cfg.quant.format == "bf16":
                    yield base + "weight", hf[short][j]
                else:
                    yield base + "weight_packed", hf[short + "_packed"][j]
                    yield base + "weight_scale", hf[short + "_scale"][j].astype(jnp.bfloat16)  # exact
                    yield base + "weight_shape", np.array(_expert_shapes(cfg)[short], np.int64)


def save_target_hf(path: str | os.PathLike, cfg: ModelConfig, params, *,
                   max_shard_bytes: int | None = None, prefix: str = "") -> None:
    """Write config.json and safetensors in the layout `load_target` reads (tensors keep the
    params' dtypes). prefix="language_model." writes the K2.5/K2.6 form: prefixed tensor names and
    the text config nested under `text_config` (quantization_config at the top level). An earlier
    checkpoint in `path` is replaced as one change (`safetensors_io.write_checkpoint`): a load
    finds the old one or the new one, or (after a save killed midway) refuses the directory."""
    if prefix not in ("", LM_PREFIX):
        raise ValueError(f"prefix must be '' or {LM_PREFIX!r}, got {prefix!r}")
    check_params(cfg, params)
    config = cfg.to_hf()
    if prefix:
        quant = config.pop("quantization_config", None)
        config = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
                  "text_config": config}
        if quant is not None:
            config["quantization_config"] = quant
    write_checkpoint(path, config, _hf_tensors(cfg, params, prefix), max_shard_bytes)


# ---- Orbax ---------------------------------------------------------------------------------

def _int4_leaves(params) -> bool:
    return any(str(getattr(k[-1], "key", "")).endswith("_qweight")
               for k, _ in jax.tree_util.tree_flatten_with_path(params)[0])


def save_checkpoint(path: str | os.PathLike, cfg: ModelConfig, params, *, overwrite: bool = False) -> None:
    """Orbax checkpoint: path/config.json (cfg.to_hf()), path/params (the pytree as it is) and,
    for INT4 experts (kept in the kernels' layout), path/int4_layout.json with its version.

    Written in a new directory beside `path` that takes its place whole when complete: a
    non-empty `path` raises FileExistsError before anything is written, or (overwrite=True) is
    replaced; a save killed midway leaves `path` as it was."""
    check_params(cfg, params)
    with staged_directory(path, overwrite=overwrite, what="checkpoint") as tmp:
        write_json(os.path.join(tmp, "config.json"), cfg.to_hf(), indent=2)
        if _int4_leaves(params):
            write_json(os.path.join(tmp, "int4_layout.json"), {"int4_kernel_layout": int4.LAYOUT_VERSION})
        with ocp.StandardCheckpointer() as ckpt:
            ckpt.save(os.path.join(tmp, "params"), params)


def restore_checkpoint(path: str | os.PathLike, *, check_finite: bool = True) -> tuple[ModelConfig, dict]:
    """Inverse of `save_checkpoint`: (cfg, params) bit-exact, params on the default device. INT4
    experts saved in another kernel layout version than this code's are refused, and (check_finite)
    float leaves holding NaN or Inf (CheckpointError naming the leaf)."""
    path = os.path.abspath(os.fspath(path))
    cfg, _ = _read_config(path)
    params_dir = os.path.join(path, "params")
    if not os.path.isdir(params_dir):
        raise CheckpointError(f"no Orbax params directory at {params_dir}")
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    with ocp.StandardCheckpointer() as ckpt:
        meta = _orbax_metadata(ckpt, params_dir)
        if _int4_leaves(meta):
            _check_int4_layout(path)
        target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), meta)
        try:
            params = ckpt.restore(params_dir, target)
        except (FileNotFoundError, ValueError) as e:
            raise CheckpointError(f"{params_dir}: the Orbax checkpoint does not restore ({e})") from None
    check_params(cfg, params)
    if check_finite:
        for key, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
            if jnp.issubdtype(leaf.dtype, jnp.floating) and not bool(jnp.isfinite(leaf).all()):
                raise CheckpointError(f"{params_dir}: params{jax.tree_util.keystr(key)} holds NaN or Inf; "
                                      "restore with check_finite=False to read it anyway")
    return cfg, params


def _orbax_metadata(ckpt, params_dir: str):
    """The saved pytree's metadata; CheckpointError naming the directory (and its _METADATA file,
    where that is missing) when Orbax finds none."""
    if not os.path.isfile(os.path.join(params_dir, "_METADATA")):
        raise CheckpointError(f"{params_dir}: not a complete Orbax checkpoint: its _METADATA file is "
                              "missing")
    try:
        meta, why = ckpt.metadata(params_dir).item_metadata, "no metadata"
    except (FileNotFoundError, ValueError, KeyError) as e:
        meta, why = None, f"{type(e).__name__}: {e}"
    if meta is None:
        raise CheckpointError(f"{params_dir}: not a complete Orbax checkpoint ({why}; files: "
                              f"{listing(os.listdir(params_dir))})")
    return meta.tree


def _check_int4_layout(path: str) -> None:
    marker = os.path.join(path, "int4_layout.json")
    version = 1                                     # no marker: layout version 1
    if os.path.exists(marker):
        version = read_json(marker, "int4_layout.json").get("int4_kernel_layout")
    if version != int4.LAYOUT_VERSION:
        raise CheckpointError(f"{path}: its INT4 experts are in kernel layout version {version}, this code "
                              f"reads version {int4.LAYOUT_VERSION}; convert them again from the HF "
                              f"checkpoint (load_target) and save a new one")
