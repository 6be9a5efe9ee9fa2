"""Self-distillation data for the drafter: the target's own greedy continuations.

  python experiments/distill_data.py --target=assets/pair/target --out=runs/distill/greedy.npz

Prompts are `--num_sequences` windows of `--prompt_len` tokens at random offsets of the training
stream (the held-out modules are never in it), each continued greedily (temperature 0, engine
method "ar") by the target for `--new_tokens`, `--streams` sequences per generate call. At
temperature 0 a drafter is accepted exactly when it predicts the target's greedy choice, so
training on these continuations (train_drafter.py --config.distill_data=...) teaches the drafter
what it is measured on. Writes tokens uint16 [N, prompt_len + new_tokens] and meta (command,
target sha256, corpus metadata, seed, device, seconds) to one .npz.
"""

from __future__ import annotations

import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from ddtree_jax import progress
from ddtree_jax.atomic_io import atomic_path
from ddtree_jax.training import data, trainer
from ddtree_jax.checkpoint import load_target
from ddtree_jax.tokenizer import Tokenizer

_TARGET = flags.DEFINE_string("target", "assets/pair/target", "target checkpoint (HF layout)")
_TOK, _CACHE = data.corpus_flags()
_OUT = flags.DEFINE_string("out", "runs/distill/greedy.npz", "output .npz")
_N = flags.DEFINE_integer("num_sequences", 65536, "continuations to generate")
_PROMPT = flags.DEFINE_integer("prompt_len", 64, "tokens of training text per prompt")
_NEW = flags.DEFINE_integer("new_tokens", 192, "greedy tokens generated per prompt")
_STREAMS = flags.DEFINE_integer("streams", 8192, "sequences per generate call")
_DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float32"], "target dtype")
_SEED = flags.DEFINE_integer("seed", 7, "prompt offsets")
_PROGRESS = progress.flag()


def main(argv):
    del argv
    if min(_N.value, _PROMPT.value, _NEW.value, _STREAMS.value) < 1:
        raise ValueError("num_sequences, prompt_len, new_tokens and streams must be >= 1")
    t0 = time.perf_counter()
    tok = Tokenizer.load(_TOK.value)
    stream, corpus_meta = data.build_corpus(tok, _TOK.value, _CACHE.value, show_progress=_PROGRESS.value)
    rng = np.random.default_rng(_SEED.value)
    starts = rng.integers(0, stream.size - _PROMPT.value, size=_N.value)
    prompts = np.stack([stream[s:s + _PROMPT.value] for s in starts]).astype(np.int64)
    dtype = jnp.bfloat16 if _DTYPE.value == "bfloat16" else jnp.float32
    target = load_target(_TARGET.value, dtype=dtype)
    seqs = trainer.greedy_continuations(target, prompts, _NEW.value, _STREAMS.value, _PROGRESS.value)
    meta = {"command": "python " + " ".join(sys.argv), "target": os.path.abspath(_TARGET.value),
            "target_sha256": data.file_sha256(os.path.join(_TARGET.value, "model.safetensors")),
            "prompt_len": _PROMPT.value, "new_tokens": _NEW.value, "num_sequences": _N.value,
            "seed": _SEED.value, "dtype": _DTYPE.value, "device": jax.devices()[0].device_kind,
            "jax": jax.__version__, "seconds": time.perf_counter() - t0, "corpus": corpus_meta}
    with atomic_path(_OUT.value) as tmp:
        np.savez(tmp, tokens=seqs.astype(np.uint16), meta=json.dumps(meta))
    print(f"distill: {seqs.shape[0]} x {seqs.shape[1]} tokens in {meta['seconds']:.0f} s -> {_OUT.value}")


if __name__ == "__main__":
    app.run(main)
