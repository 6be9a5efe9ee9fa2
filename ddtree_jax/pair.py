"""A target, its drafter and their tokenizer as the shipped pair lays them out: `load_pair(dir)`.

<dir>/target is the target, an HF checkpoint (`load_target`); <dir>/drafter its DFlash drafter
(`load_drafter`). The tokenizer is the target checkpoint's own tokenizer.json where it has one
(an HF checkpoint's), otherwise <dir>/tokenizer.json (the shipped pair's), otherwise there is none.
SHIPPED is the pair in this repository's assets/ (docs/shipped_pair.md).
"""

from __future__ import annotations

import os
from typing import NamedTuple

import jax.numpy as jnp

from ddtree_jax.checkpoint import load_target
from ddtree_jax.drafter_io import load_drafter
from ddtree_jax.tokenizer import TOKENIZER_FILE, Tokenizer

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
