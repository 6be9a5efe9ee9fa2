"""Read and write DFlash drafters in the published z-lab Hugging Face layout.

A checkpoint directory holds `config.json` (Qwen3-style, with `dflash_config`) and
`model.safetensors` (or shards listed by `model.safetensors.index.json`) with torch names:
  fc.weight [d, len(ids)*d]; hidden_norm.weight [d]; norm.weight [d]
  layers.{i}.input_layernorm.weight, layers.{i}.post_attention_layernorm.weight [d]
  layers.{i}.self_attn.{q,k,v,o}_proj.weight [out, in]; layers.{i}.self_attn.{q,k}_norm.weight [hd]
  layers.{i}.mlp.{gate,up,down}_proj.weight [out, in]
Linear weights are transposed to / from the `[in, out]` kernels of `ddtree_jax.drafter`.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import traverse_util
from safetensors import safe_open
from safetensors.numpy import save_file

from ddtree_jax.config import DrafterConfig

_FLOAT_DTYPES = ("BF16", "F16", "F32", "F64")


class DrafterCheckpointError(ValueError):
    """A drafter checkpoint's tensors are missing, unexpected, or of the wrong shape or dtype."""


def hf_layout(cfg: DrafterConfig) -> dict[str, tuple[tuple[str, ...], tuple[int, ...]]]:
    """HF tensor name -> (params path, HF shape). Paths ending in "kernel" are transposed."""
    d, hd, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    out = {"fc.weight": (("fc", "kernel"), (d, len(cfg.target_layer_ids) * d)),
           "hidden_norm.weight": (("hidden_norm", "scale"), (d,)),
           "norm.weight": (("norm", "scale"), (d,))}
    linears = {"self_attn.q_proj": (q, d), "self_attn.k_proj": (kv, d), "self_attn.v_proj": (kv, d),
               "self_attn.o_proj": (d, q), "mlp.gate_proj": (inter, d), "mlp.up_proj": (inter, d),
               "mlp.down_proj": (d, inter)}
    norms = {"input_layernorm": d, "post_attention_layernorm": d,
             "self_attn.q_norm": hd, "self_attn.k_norm": hd}
    for i in range(cfg.num_hidden_layers):
        for name, shape in linears.items():
            out[f"layers.{i}.{name}.weight"] = ((f"layers_{i}", *name.split("."), "kernel"), shape)
        for name, width in norms.items():
            out[f"layers.{i}.{name}.weight"] = ((f"layers_{i}", *name.split("."), "scale"), (width,))
    return out


def _tensor_files(path: str) -> dict[str, str]:
    """Tensor name -> safetensors file under the checkpoint directory `path`."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        files = {name: os.path.join(path, fname) for name, fname in weight_map.items()}
        absent = sorted({f for f in files.values() if not os.path.isfile(f)})
        if absent:
            raise DrafterCheckpointError(f"shard(s) listed in {index} not found: {absent}")
        return files
    single = os.path.join(path, "model.safetensors")
    if not os.path.isfile(single):
        raise DrafterCheckpointError(f"no model.safetensors or model.safetensors.index.json in {path}")
    with safe_open(single, framework="numpy") as f:
        return {name: single for name in f.keys()}


def _list(names) -> str:
    names = sorted(names)
    return ", ".join(names[:8]) + (f" ... ({len(names)} in all)" if len(names) > 8 else "")


def load_drafter(path: str | os.PathLike, dtype: Any = jnp.bfloat16) -> tuple[DrafterConfig, dict]:
    """Read a z-lab DFlash checkpoint directory -> (DrafterConfig, params in `dtype`).

    Every tensor name, shape and dtype is checked from the file headers before any tensor is read;
    tensors are then read one at a time. Raises DrafterCheckpointError (or ConfigError for
    config.json) naming the offending tensor or field; nothing is returned half-loaded.
    """
    path = os.fspath(path)
    cfg = DrafterConfig.from_hf(path)
    layout = hf_layout(cfg)
    files = _tensor_files(path)
    missing, extra = set(layout) - set(files), set(files) - set(layout)
    if missing or extra:
        raise DrafterCheckpointError(
            f"drafter checkpoint {path} does not match its config.json:"
            + (f" missing tensor(s): {_list(missing)};" if missing else "")
            + (f" unexpected tensor(s): {_list(extra)};" if extra else ""))
    by_file: dict[str, list[str]] = {}
    for name, fname in files.items():
        by_file.setdefault(fname, []).append(name)
    problems = []
    for fname, names in by_file.items():
        with safe_open(fname, framework="numpy") as f:
            for name in names:
                sl = f.get_slice(name)
                shape, kind = tuple(sl.get_shape()), sl.get_dtype()
                if shape != layout[name][1]:
                    problems.append(f"{name}: shape {list(shape)}, expected {list(layout[name][1])}")
                if kind not in _FLOAT_DTYPES:
                    problems.append(f"{name}: dtype {kind}, expected one of {_FLOAT_DTYPES}")
    if problems:
        raise DrafterCheckpointError(f"drafter checkpoint {path}: " + "; ".join(problems))
    flat = {}
    for fname, names in by_file.items():
        with safe_open(fname, framework="numpy") as f:
            for name in names:
                key = layout[name][0]
                arr = f.get_tensor(name)
                flat[key] = jnp.asarray(arr.T if key[-1] == "kernel" else arr, dtype)
    return cfg, traverse_util.unflatten_dict(flat)


def save_drafter(path: str | os.PathLike, cfg: DrafterConfig, params: dict) -> None:
    """Write `params` (the `init_drafter` / `load_drafter` pytree) as a z-lab DFlash checkpoint:
    `config.json` + `model.safetensors`, arrays in their own dtype."""
    layout = hf_layout(cfg)
    flat = traverse_util.flatten_dict(params)
    by_key = {key: (name, shape) for name, (key, shape) in layout.items()}
    missing, extra = set(by_key) - set(flat), set(flat) - set(by_key)
    if missing or extra:
        raise DrafterCheckpointError(
            "params do not match the drafter config:"
            + (f" missing {_list('/'.join(k) for k in missing)};" if missing else "")
            + (f" unexpected {_list('/'.join(k) for k in extra)};" if extra else ""))
    tensors = {}
    for key, leaf in flat.items():
        name, shape = by_key[key]
        arr = np.asarray(leaf)
        arr = arr.T if key[-1] == "kernel" else arr
        if arr.shape != shape:
            raise DrafterCheckpointError(
                f"param {'/'.join(key)} has shape {list(np.shape(leaf))}, expected "
                f"{list(shape[::-1] if key[-1] == 'kernel' else shape)}")
        tensors[name] = np.ascontiguousarray(arr)
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg.to_hf(), f, indent=2)
    save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
