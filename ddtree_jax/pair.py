"""A target, its drafter and their tokenizer as the shipped pair lays them out: `load_pair(dir)`.

<dir>/target is the target, an HF checkpoint (`load_target`); <dir>/drafter its DFlash drafter
(`load_drafter`). The tokenizer is the target checkpoint's own tokenizer.json where it has one
(an HF checkpoint's), otherwise <dir>/tokenizer.json (the shipped pair's), otherwise there is none.
SHIPPED is the pair in this repository's assets/ (docs/shipped_pair.md); its MANIFEST.json
(experiments/ship_pair.py) records every file's sha256, the data, the commands and the training.
"""

from __future__ import annotations

import json
import os
from typing import NamedTuple

import jax.numpy as jnp

from ddtree_jax.checkpoint import load_target
from ddtree_jax.drafter_io import load_drafter
from ddtree_jax.tokenizer import TOKENIZER_FILE, Tokenizer
from ddtree_jax.training.data import file_sha256

SHIPPED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "pair")


class Pair(NamedTuple):
    target: tuple                  # (ModelConfig, params)
    drafter: tuple                 # (DrafterConfig, params)
    tokenizer: Tokenizer | None


def find_tokenizer(*directories: str | os.PathLike) -> Tokenizer | None:
    """The Tokenizer of the first directory that holds a tokenizer.json, or None."""
    for d in directories:
        if os.path.isfile(os.path.join(d, TOKENIZER_FILE)):
            return Tokenizer.load(d)
    return None


def load_pair(directory: str | os.PathLike = SHIPPED, dtype=jnp.bfloat16) -> Pair:
    """The target, drafter and tokenizer in `directory` (the layout above), weights in `dtype`.
    FileNotFoundError naming a missing directory; ValueError when the tokenizer has ids the
    target's vocabulary lacks."""
    directory = os.fspath(directory)
    target_dir, drafter_dir = os.path.join(directory, "target"), os.path.join(directory, "drafter")
    for d in (target_dir, drafter_dir):
        if not os.path.isdir(d):
            raise FileNotFoundError(f"{d} not found: a pair directory holds target/ and drafter/")
    target = load_target(target_dir, dtype=dtype)
    tokenizer = find_tokenizer(target_dir, directory)
    if tokenizer is not None and tokenizer.vocab_size > target[0].vocab_size:
        raise ValueError(f"{directory}: the tokenizer has {tokenizer.vocab_size} ids, more than the "
                         f"target's vocab_size {target[0].vocab_size} ({target_dir}/config.json)")
    return Pair(target, load_drafter(drafter_dir, dtype=dtype), tokenizer)


def manifest_record(directory: str | os.PathLike, name: str, unchecked: tuple[str, ...] = ()) -> dict:
    """The record of the pair's "target" or "drafter" in `directory`/MANIFEST.json, as its training
    run's summary.json holds it: command (without "python "), data (the target's corpus; the
    drafter's distillation data, or None), steps, final_loss, loop_seconds, device, config (and the
    drafter's slot_accuracy, tau_on_data, and "retap", retap_drafter.py's summary, where it was
    re-tapped). ValueError naming the file when one of `name`/ or
    `name`_loss.png is not the file the manifest lists (except the paths in `unchecked`)."""
    if name not in ("target", "drafter"):
        raise ValueError(f"name must be 'target' or 'drafter', got {name!r}")
    directory = os.fspath(directory)
    path = os.path.join(directory, "MANIFEST.json")
    with open(path) as f:
        manifest = json.load(f)
    for rel, entry in manifest["files"].items():
        if rel.split("/")[0] in (name, f"{name}_loss.png") and rel not in unchecked:
            if file_sha256(os.path.join(directory, rel)) != entry["sha256"]:
                raise ValueError(f"{os.path.join(directory, rel)} is not the file {path} lists "
                                 "(sha256 differs)")
    script = {"target": "train_target.py", "drafter": "train_drafter.py"}[name]
    command = next(c for c in manifest["commands"] if script in c)
    data = manifest["data"] if name == "target" else manifest.get("distill_data")
    record = {"command": command.removeprefix("python "), "data": data, **manifest["training"][name]}
    retap = manifest["training"].get("drafter_retap")
    if name == "drafter" and retap is not None:   # retap_drafter.py's summary, its command included
        record["retap"] = {"command": next(c for c in manifest["commands"] if "retap_drafter.py" in c),
                           **retap}
    return record
