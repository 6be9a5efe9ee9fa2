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

import os
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from ddtree_jax.config import DrafterConfig
from ddtree_jax.safetensors_io import (FLOAT_DTYPES, CheckpointError, TensorReader, check_complete,
                                       listing, write_checkpoint)


class DrafterCheckpointError(CheckpointError):
    """A drafter checkpoint's files or tensors are missing, unexpected, or of the wrong shape or
    dtype (a CheckpointError, hence also a ValueError)."""


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


def load_drafter(path: str | os.PathLike, dtype: Any = jnp.bfloat16, *,
                 check_finite: bool = True) -> tuple[DrafterConfig, dict]:
    """Read a z-lab DFlash checkpoint directory -> (DrafterConfig, params in `dtype`).

    Every tensor name, shape and dtype is checked from the file headers before any tensor is read;
    tensors are then read one at a time (check_finite: each refused if it holds NaN or Inf). Raises
    DrafterCheckpointError (or ConfigError for config.json) naming the offending file, tensor or
    field; nothing is returned half-loaded.
    """
    path = os.fspath(path)
    try:
        check_complete(path)
    except CheckpointError as e:
        raise DrafterCheckpointError(str(e)) from None
    cfg = DrafterConfig.from_hf(path)
    layout = hf_layout(cfg)
    try:
        reader = TensorReader(path, check_finite)
    except CheckpointError as e:  # missing files, an index without weight_map or naming the wrong shard
        raise DrafterCheckpointError(f"drafter checkpoint {path}: {e}") from e
    with reader:
        missing, extra = set(layout) - reader.names, reader.names - set(layout)
        if missing or extra:
            raise DrafterCheckpointError(
                f"drafter checkpoint {path} does not match its config.json:"
                + (f" missing tensor(s): {listing(missing)};" if missing else "")
                + (f" unexpected tensor(s): {listing(extra)};" if extra else ""))
        problems = []
        for name, (_, want) in layout.items():
            shape, kind = reader.shape(name), reader.dtype(name)
            if shape != want:
                problems.append(f"{name}: shape {list(shape)}, expected {list(want)}")
            if kind not in FLOAT_DTYPES:
                problems.append(f"{name}: dtype {kind}, expected one of {FLOAT_DTYPES}")
        if problems:
            raise DrafterCheckpointError(f"drafter checkpoint {path}: " + "; ".join(problems))
        flat = {}
        for name, (key, _) in layout.items():
            try:
                arr = reader.get(name)
            except CheckpointError as e:
                raise DrafterCheckpointError(f"drafter checkpoint {path}: {e}") from None
            flat[key] = jnp.asarray(arr.T if key[-1] == "kernel" else arr, dtype)
    return cfg, traverse_util.unflatten_dict(flat)


def save_drafter(path: str | os.PathLike, cfg: DrafterConfig, params: dict) -> None:
    """Write `params` (the `init_drafter` / `load_drafter` pytree) as a z-lab DFlash checkpoint:
    `config.json` + `model.safetensors`, arrays in their own dtype, replacing an earlier checkpoint
    in `path` as one change (`safetensors_io.write_checkpoint`)."""
    layout = hf_layout(cfg)
    flat = traverse_util.flatten_dict(params)
    by_key = {key: (name, shape) for name, (key, shape) in layout.items()}
    missing, extra = set(by_key) - set(flat), set(flat) - set(by_key)
    if missing or extra:
        raise DrafterCheckpointError(
            "params do not match the drafter config:"
            + (f" missing {listing('/'.join(k) for k in missing)};" if missing else "")
            + (f" unexpected {listing('/'.join(k) for k in extra)};" if extra else ""))
    tensors = {}
    for key, leaf in flat.items():
        name, shape = by_key[key]
        arr = np.asarray(leaf)
        arr = arr.T if key[-1] == "kernel" else arr
        if arr.shape != shape:
            raise DrafterCheckpointError(
                f"param {'/'.join(key)} has shape {list(np.shape(leaf))}, expected "
                f"{list(shape[::-1] if key[-1] == 'kernel' else shape)}")
        tensors[name] = arr
    write_checkpoint(path, cfg.to_hf(), tensors.items())
