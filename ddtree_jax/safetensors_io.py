"""Safetensors directories in the HF layout: one `model.safetensors`, or shards listed by
`model.safetensors.index.json` (`weight_map`: tensor name -> shard file).

`TensorReader` reads headers (shape, dtype) without touching data and returns one tensor at a
time from the memory-mapped files (numpy; bf16 as ml_dtypes.bfloat16). `write_tensors` streams
(name, array) pairs into shards of at most `max_shard_bytes` each.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Iterable

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
INT_DTYPES = ("I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64")


class CheckpointError(ValueError):
    """A checkpoint's files or tensors do not match what the configuration requires."""


def listing(names) -> str:
    """Sorted names for an error message: the first 8, then how many more."""
    names = sorted(names)
    more = f" ... and {len(names) - 8} more" if len(names) > 8 else ""
    return ", ".join(names[:8]) + more


class TensorReader:
    """Name -> tensor access over a safetensors directory; use as a context manager."""

    def __init__(self, directory: str | os.PathLike):
        directory = os.fspath(directory)
        index_path = os.path.join(directory, INDEX)
        if os.path.isfile(index_path):
            with open(index_path) as f:
                weight_map = json.load(f).get("weight_map")
            if not isinstance(weight_map, dict):
                raise CheckpointError(f"{index_path}: no 'weight_map' object")
        elif os.path.isfile(os.path.join(directory, SINGLE)):
            weight_map = None
        else:
            raise CheckpointError(f"no {SINGLE} or {INDEX} in {directory}")
        files = sorted(set(weight_map.values())) if weight_map is not None else [SINGLE]
        missing = [f for f in files if not os.path.isfile(os.path.join(directory, f))]
        if missing:
            raise CheckpointError(f"shard file(s) listed in {INDEX} not found in {directory}: {missing}")
        self._stack = contextlib.ExitStack()
        try:
            self._handles = {f: self._stack.enter_context(
                safe_open(os.path.join(directory, f), framework="numpy")) for f in files}
            if weight_map is None:
                weight_map = {name: SINGLE for name in self._handles[SINGLE].keys()}
            keys = {f: set(h.keys()) for f, h in self._handles.items()}
            for name, f in weight_map.items():
                if name not in keys[f]:
                    raise CheckpointError(f"tensor {name!r}: listed in {INDEX} under {f} but not in it")
        except BaseException:
            self._stack.close()
            raise
        self._where = weight_map
        self.names = frozenset(weight_map)

    def __enter__(self) -> "TensorReader":
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handles[self._where[name]].get_slice(name).get_shape())

    def dtype(self, name: str) -> str:
        """The safetensors dtype code, e.g. "BF16", "F32", "I32"."""
        return self._handles[self._where[name]].get_slice(name).get_dtype()

    def get(self, name: str) -> np.ndarray:
        return self._handles[self._where[name]].get_tensor(name)


def write_tensors(directory: str | os.PathLike, tensors: Iterable[tuple[str, np.ndarray]],
                  max_shard_bytes: int | None = None) -> None:
    """Write `tensors` to `model.safetensors`, or (max_shard_bytes set) to
    `model-0000k-of-0000n.safetensors` shards plus `model.safetensors.index.json`.
    Holds one shard in host memory at a time."""
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    meta = {"format": "pt"}
    if max_shard_bytes is None:
        save_file({n: np.ascontiguousarray(a) for n, a in tensors}, os.path.join(directory, SINGLE),
                  metadata=meta)
        return
    if max_shard_bytes <= 0:
        raise ValueError(f"max_shard_bytes must be > 0, got {max_shard_bytes}")
    shards: list[list[str]] = []
    current: dict[str, np.ndarray] = {}
    size = total = 0

    def flush():
        save_file(current, os.path.join(directory, f".shard-{len(shards):05d}.tmp"), metadata=meta)
        shards.append(list(current))
        current.clear()

    for name, a in tensors:
        if current and size + a.nbytes > max_shard_bytes:
            flush()
            size = 0
        current[name] = np.ascontiguousarray(a)
        size += a.nbytes
        total += a.nbytes
    if current or not shards:
        flush()
    weight_map = {}
    for k, names in enumerate(shards):
        final = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        os.replace(os.path.join(directory, f".shard-{k:05d}.tmp"), os.path.join(directory, final))
        weight_map.update({n: final for n in names})
    with open(os.path.join(directory, INDEX), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
