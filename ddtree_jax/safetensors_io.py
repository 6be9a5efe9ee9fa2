"""Safetensors directories in the HF layout: one `model.safetensors`, or shards listed by
`model.safetensors.index.json` (`weight_map`: tensor name -> shard file), beside `config.json`.

`TensorReader` reads headers (shape, dtype) without touching data and returns one tensor at a
time from the memory-mapped files (numpy; bf16 as ml_dtypes.bfloat16), checking that every float
tensor it returns is finite. It refuses, naming the file: a directory holding both layouts, an
index that is not JSON, a shard that is truncated or a Git LFS pointer, and a directory whose last
save did not finish (PENDING present).

`write_checkpoint` replaces config.json and the weights of a directory as one change: the new
files are written under temporary names, PENDING records the renames, the files are renamed into
place, the earlier save's weight files are removed, then PENDING. A save killed before PENDING
leaves the earlier checkpoint as it was; one killed after it leaves a directory every loader
refuses, naming PENDING, until a save completes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from typing import Iterable

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from ddtree_jax.atomic_io import TMP_PREFIX, fsync_path, temp_file, write_json

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
CONFIG = "config.json"
PENDING = "save-in-progress.json"
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
INT_DTYPES = ("I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64")
_SHARD_RE = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
_LFS_POINTER = b"version https://git-lfs.github.com/spec/"


class CheckpointError(ValueError):
    """A checkpoint's files or tensors do not match what the configuration requires."""


def listing(names) -> str:
    """Sorted names for an error message: the first 8, then how many more."""
    names = sorted(names)
    more = f" ... and {len(names) - 8} more" if len(names) > 8 else ""
    return ", ".join(names[:8]) + more


def check_complete(directory: str) -> None:
    """CheckpointError naming PENDING when a save into `directory` did not finish."""
    pending = os.path.join(directory, PENDING)
    if os.path.exists(pending):
        raise CheckpointError(f"{pending}: a save into {directory} did not finish, so its files may "
                              "mix two saves; save the checkpoint again")


def read_json(path: str, what: str = "file", error: type[ValueError] = CheckpointError) -> dict:
    """A JSON object from `path`; `error` naming the file when it is missing, not JSON or not an
    object (`what` says what the file should be)."""
    if not os.path.isfile(path):
        raise error(f"{what} not found: {path}")
    try:
        with open(path, "rb") as f:
            head = f.read(len(_LFS_POINTER))
            f.seek(0)
            obj = json.loads(f.read().decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:   # JSONDecodeError is a ValueError
        lfs = " (a Git LFS pointer file: fetch the file with git lfs pull)" if head == _LFS_POINTER else ""
        raise error(f"{path}: not valid JSON{lfs}: {e}") from None
    if not isinstance(obj, dict):
        raise error(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _open_shard(path: str):
    """safe_open(path), with a damaged file (a Git LFS pointer, a truncated or foreign file) named."""
    try:
        return safe_open(path, framework="numpy")
    except SafetensorError as e:
        with open(path, "rb") as f:
            head = f.read(len(_LFS_POINTER))
        if head == _LFS_POINTER:
            raise CheckpointError(f"{path} is a Git LFS pointer file, not the weights: fetch them "
                                  "(git lfs pull)") from None
        raise CheckpointError(f"{path}: not a complete safetensors file ({e})") from None


def _weight_map(directory: str) -> dict[str, str] | None:
    """The index's weight_map (checked), or None for a single-file directory."""
    index_path, single_path = os.path.join(directory, INDEX), os.path.join(directory, SINGLE)
    if os.path.isfile(index_path) and os.path.isfile(single_path):
        raise CheckpointError(f"{directory} holds both {SINGLE} and {INDEX}: two checkpoints in one "
                              "directory; remove the one that is not meant")
    if not os.path.isfile(index_path):
        if not os.path.isfile(single_path):
            raise CheckpointError(f"no {SINGLE} or {INDEX} in {directory}")
        return None
    weight_map = read_json(index_path, INDEX).get("weight_map")
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index_path}: no 'weight_map' object")
    bad = [k for k, f in weight_map.items()
           if not isinstance(f, str) or os.path.basename(f) != f or not f.endswith(".safetensors")]
    if bad:
        raise CheckpointError(f"{index_path}: weight_map entries must name .safetensors files in "
                              f"{directory}; bad entries for {listing(bad)}")
    return weight_map


class TensorReader:
    """Name -> tensor access over a safetensors directory; use as a context manager.
    check_finite: `get` raises CheckpointError naming a float tensor that holds NaN or Inf."""

    def __init__(self, directory: str | os.PathLike, check_finite: bool = True):
        directory = os.fspath(directory)
        check_complete(directory)
        weight_map = _weight_map(directory)
        files = sorted(set(weight_map.values())) if weight_map is not None else [SINGLE]
        missing = [f for f in files if not os.path.isfile(os.path.join(directory, f))]
        if missing:
            raise CheckpointError(f"shard file(s) listed in {INDEX} not found in {directory}: {missing}")
        self._stack = contextlib.ExitStack()
        try:
            self._handles = {f: self._stack.enter_context(_open_shard(os.path.join(directory, f)))
                             for f in files}
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
        self.directory = directory
        self.names = frozenset(weight_map)
        self.check_finite = check_finite

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
        a = self._handles[self._where[name]].get_tensor(name)
        if self.check_finite and self.dtype(name) in FLOAT_DTYPES and not np.isfinite(a).all():
            bad = int(a.size - np.isfinite(a).sum())
            where = os.path.join(self.directory, self._where[name])
            raise CheckpointError(f"tensor {name!r} ({where}) holds {bad} NaN or Inf value(s); "
                                  "load with check_finite=False to read it anyway")
        return a


# ---- writing -------------------------------------------------------------------------------

def _shards(tensors: Iterable[tuple[str, np.ndarray]], max_shard_bytes: int | None):
    """Groups of (name, array) of at most max_shard_bytes each (one group when None)."""
    current: dict[str, np.ndarray] = {}
    size = 0
    for name, a in tensors:
        if max_shard_bytes is not None and current and size + a.nbytes > max_shard_bytes:
            yield current
            current, size = {}, 0
        current[name] = np.ascontiguousarray(a)
        size += a.nbytes
    yield current


def _old_weight_files(directory: str) -> set[str]:
    """The weight files of an earlier save: model.safetensors, the index, the files its
    weight_map names (where it parses) and files named like shards."""
    names = set(os.listdir(directory))
    old = {n for n in names if n in (SINGLE, INDEX) or _SHARD_RE.fullmatch(n)}
    if INDEX in names:
        with contextlib.suppress(CheckpointError):
            wm = read_json(os.path.join(directory, INDEX), INDEX).get("weight_map")
            if isinstance(wm, dict):
                old |= {f for f in wm.values() if isinstance(f, str)} & names
    return old


def write_checkpoint(directory: str | os.PathLike, config: dict,
                     tensors: Iterable[tuple[str, np.ndarray]], max_shard_bytes: int | None = None) -> None:
    """Write `config` as config.json and `tensors` as `model.safetensors`, or (max_shard_bytes set)
    as `model-0000k-of-0000n.safetensors` shards plus `model.safetensors.index.json`, replacing an
    earlier save's weight files as one change (module docstring). Holds one shard in host memory
    at a time; other files in `directory` are left alone."""
    if max_shard_bytes is not None and not (isinstance(max_shard_bytes, int) and max_shard_bytes > 0):
        raise ValueError(f"max_shard_bytes must be a positive int or None, got {max_shard_bytes!r}")
    directory = os.path.abspath(os.fspath(directory))
    os.makedirs(directory, exist_ok=True)
    written: list[str] = []            # temporary files, in order: config, shards, index

    def stage(final: str, write) -> None:
        with temp_file(os.path.join(directory, final)) as tmp:
            written.append(tmp)
            write(tmp)

    try:
        stage(CONFIG, lambda tmp: _dump(config, tmp))
        shards, total = [], 0
        for shard in _shards(tensors, max_shard_bytes):
            stage(SINGLE, lambda tmp: save_file(shard, tmp, metadata={"format": "pt"}))
            shards.append(list(shard))
            total += sum(a.nbytes for a in shard.values())
        if max_shard_bytes is None:
            finals = [CONFIG, SINGLE]
        else:
            finals = [CONFIG] + [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
                                 for k in range(len(shards))]
            weight_map = {name: final for final, names in zip(finals[1:], shards) for name in names}
            stage(INDEX, lambda tmp: _dump({"metadata": {"total_size": total}, "weight_map": weight_map}, tmp))
            finals.append(INDEX)
    except BaseException:
        for tmp in written:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        raise
    _commit(directory, dict(zip(finals, written)))


def _dump(obj, path: str) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)


def _commit(directory: str, staged: dict[str, str]) -> None:
    """Rename the staged files into place and remove the earlier save's weight files and the
    temporary files of a save killed midway, PENDING recording the change while it happens."""
    stale = sorted(_old_weight_files(directory) - staged.keys())
    ours = {os.path.basename(t) for t in staged.values()}
    stale += sorted(n for n in os.listdir(directory) if n not in ours and any(
        n.startswith(f"{TMP_PREFIX}{f}.") for f in (CONFIG, SINGLE, INDEX, PENDING)))
    pending = os.path.join(directory, PENDING)
    write_json(pending, {"rename": {os.path.basename(t): f for f, t in staged.items()},
                         "remove": stale}, indent=1)
    for final, tmp in staged.items():
        os.replace(tmp, os.path.join(directory, final))
    for name in stale:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, name))
    fsync_path(directory)
    os.unlink(pending)
    fsync_path(directory)
