"""The offline corpus: the running interpreter's standard-library .py sources.

Files are listed sorted from `sysconfig`'s stdlib directory, without tests, idlelib, turtledemo,
encodings tables, pydoc data and site-packages. A fixed list of modules (`HELDOUT`) is never
trained on; the held-out prompts come from them. Training text = every other file, each as
`[BOS] + tokens + [EOS]`, concatenated into one uint16 stream (cached as .npz with its metadata:
Python version, file count, sha256 of the text, tokenizer sha256).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sysconfig

import numpy as np

from ddtree_jax import progress
from ddtree_jax.atomic_io import atomic_path
from ddtree_jax.tokenizer import BOS, EOS, Tokenizer

EXCLUDED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idlelib", "turtledemo",
                 "encodings", "pydoc_data", "ensurepip", "__pycache__", "__phello__"}
HELDOUT = ("bisect.py", "calendar.py", "difflib.py", "fractions.py", "graphlib.py", "heapq.py",
           "shlex.py", "statistics.py", "string.py", "textwrap.py")


def stdlib_files(root: str | None = None) -> list[str]:
    """Sorted relative paths of the stdlib .py files the corpus may use (held-out ones included)."""
    root = root or sysconfig.get_paths()["stdlib"]
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in EXCLUDED_DIRS and not d.startswith("config-")]
        rel = os.path.relpath(dirpath, root)
        out += [os.path.normpath(os.path.join(rel, f)) for f in filenames
                if f.endswith(".py") and not f.startswith("test_")]
    return sorted(out)


def read(path: str, root: str | None = None) -> str:
    with open(os.path.join(root or sysconfig.get_paths()["stdlib"], path), encoding="utf-8",
              errors="replace") as f:
        return f.read()


def training_files(root: str | None = None) -> list[str]:
    return [f for f in stdlib_files(root) if f not in HELDOUT]


def file_sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def corpus_flags():
    """The absl flags --tokenizer and --corpus_cache of a script that reads the training corpus
    (`build_corpus`'s tokenizer and cache) -> their two flag holders."""
    from absl import flags

    return (flags.DEFINE_string("tokenizer", "assets/pair/tokenizer.json",
                                "tokenizer the corpus is built with"),
            flags.DEFINE_string("corpus_cache", "runs/data/corpus.npz", "training token stream cache"))


def build_corpus(tok: Tokenizer, tokenizer_path: str, cache: str,
                 max_files: int = 0, show_progress: bool = True) -> tuple[np.ndarray, dict]:
    """The training token stream and its metadata; read from `cache` when it was made by the same
    tokenizer and file limit, otherwise built from this interpreter's stdlib (the first
    `max_files` training files; 0 = all; a bar over them on a terminal with show_progress) and
    written there."""
    tok_sha = file_sha256(tokenizer_path)
    if os.path.isfile(cache):
        with np.load(cache) as z:
            meta = json.loads(str(z["meta"]))
            if meta["tokenizer_sha256"] == tok_sha and meta.get("max_files", 0) == max_files:
                return z["tokens"], meta
    files = training_files()[:max_files or None]
    digest, stream = hashlib.sha256(), []
    for f in progress.track(files, "corpus", show_progress):
        text = read(f)
        digest.update(text.encode("utf-8") + b"\0")
        stream += [BOS, *tok.encode(text), EOS]
    tokens = np.asarray(stream, np.uint16)
    meta = {"source": "Python standard library .py files (sysconfig stdlib dir)",
            "python_version": platform.python_version(), "num_files": len(files),
            "excluded_dirs": sorted(EXCLUDED_DIRS), "heldout_files": list(HELDOUT),
            "text_sha256": digest.hexdigest(), "text_sha256_of": "each file's UTF-8 text + b'\\0', in order",
            "num_tokens": int(tokens.size), "tokenizer_sha256": tok_sha, "max_files": max_files}
    with atomic_path(cache if cache.endswith(".npz") else cache + ".npz") as tmp:
        np.savez(tmp, tokens=tokens, meta=json.dumps(meta))
    return tokens, meta


def sample_batch(tokens: np.ndarray, batch: int, seq_len: int, seed: int, step: int) -> np.ndarray:
    """[batch, seq_len] int32 windows of `tokens` [N >= seq_len] at random offsets (the last
    window included); a pure function of (seed, step). A caller that shifts labels by one asks
    for seq_len + 1."""
    if tokens.size < seq_len:
        raise ValueError(f"tokens holds {tokens.size} tokens, fewer than seq_len {seq_len}")
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, tokens.size - seq_len + 1, size=batch)
    return np.stack([tokens[s:s + seq_len] for s in starts]).astype(np.int32)


def load_sequences(path: str) -> tuple[np.ndarray, dict]:
    """A distillation file of experiments/distill_data.py: (tokens uint16 [N, T], meta)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"distill_data: no file at {path} (run experiments/distill_data.py)")
    with np.load(path) as z:
        tokens, meta = z["tokens"], json.loads(str(z["meta"]))
    if tokens.ndim != 2 or tokens.shape[0] < 1:
        raise ValueError(f"distill_data {path}: tokens must be [N >= 1, T], got {tokens.shape}")
    return tokens, meta


def sample_rows(rows: np.ndarray, batch: int, seq_len: int, seed: int, step: int) -> np.ndarray:
    """[batch, seq_len] int32: random rows of `rows` [N, T >= seq_len], each at a random offset;
    a pure function of (seed, step)."""
    if rows.shape[1] < seq_len:
        raise ValueError(f"sequences of {rows.shape[1]} tokens are shorter than seq_len {seq_len}")
    rng = np.random.default_rng([seed, step])
    which = rng.integers(0, rows.shape[0], size=batch)
    offs = rng.integers(0, rows.shape[1] - seq_len + 1, size=batch)
    return np.stack([rows[w, o:o + seq_len] for w, o in zip(which, offs)]).astype(np.int32)


def make_heldout_prompts(tok: Tokenizer, per_file: int = 2, prompt_tokens: int = 96) -> list[dict]:
    """Prompts from the held-out modules: `per_file` windows starting at line starts spread over
    each file, `prompt_tokens` tokens each."""
    prompts = []
    for f in HELDOUT:
        lines = read(f).splitlines(keepends=True)
        for j in range(per_file):
            start = (j + 1) * len(lines) // (per_file + 1)
            ids = tok.encode("".join(lines[start:start + 200]))[:prompt_tokens]
            prompts.append({"file": f, "line": start + 1, "text": tok.decode(ids), "ids": ids})
    return prompts


def load_prompts(path: str) -> list[list[int]]:
    with open(path) as f:
        return [p["ids"] for p in json.load(f)["prompts"]]
