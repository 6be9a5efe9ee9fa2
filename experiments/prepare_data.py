"""Train the BPE tokenizer, write the held-out prompts, build the corpus cache.

  python experiments/prepare_data.py --tokenizer=assets/pair/tokenizer.json \
      --prompts=assets/pair/heldout_prompts.json --corpus_cache=runs/data/corpus.npz

The tokenizer (trained on every `--subsample`-th training file) and the prompts are kept in the
repo and reused when present (--retrain to replace them); the cache holds this interpreter's
training token stream and its metadata.
"""

from __future__ import annotations

import os
import platform

from absl import app, flags

from ddtree_jax import progress, tokenizer
from ddtree_jax.atomic_io import write_json
from ddtree_jax.training import data

_TOK = flags.DEFINE_string("tokenizer", "assets/pair/tokenizer.json",
                           "tokenizer.json (tokenizer_config.json is written beside it)")
_PROMPTS = flags.DEFINE_string("prompts", "assets/pair/heldout_prompts.json", "held-out prompts JSON")
_CACHE = flags.DEFINE_string("corpus_cache", "runs/data/corpus.npz", "training token stream cache")
_VOCAB = flags.DEFINE_integer("vocab_size", 2048, "tokenizer size, specials included")
_SUB = flags.DEFINE_integer("subsample", 3, "train the tokenizer on every n-th training file")
_RETRAIN = flags.DEFINE_bool("retrain", False, "replace an existing tokenizer and prompts")
_PROGRESS = progress.flag()


def main(argv):
    del argv
    if os.path.basename(_TOK.value) != tokenizer.TOKENIZER_FILE:
        raise ValueError(f"--tokenizer must name a {tokenizer.TOKENIZER_FILE} file, got {_TOK.value!r}")
    if _RETRAIN.value or not os.path.isfile(_TOK.value):
        texts = [data.read(f) for f in data.training_files()[::_SUB.value]]
        tok = tokenizer.train(texts, _VOCAB.value)
        tok.save(os.path.dirname(os.path.abspath(_TOK.value)))
        print(f"tokenizer: {tok.vocab_size} ids from {len(texts)} files -> {_TOK.value}")
    tok = tokenizer.Tokenizer.load(_TOK.value)
    if _RETRAIN.value or not os.path.isfile(_PROMPTS.value):
        prompts = data.make_heldout_prompts(tok)
        write_json(_PROMPTS.value, {"python_version": platform.python_version(),
                                    "heldout_files": list(data.HELDOUT),
                                    "tokenizer_sha256": data.file_sha256(_TOK.value), "prompts": prompts},
                   indent=1)
        print(f"prompts: {len(prompts)} from {len(data.HELDOUT)} held-out modules -> {_PROMPTS.value}")
    _, meta = data.build_corpus(tok, _TOK.value, _CACHE.value, show_progress=_PROGRESS.value)
    print(f"corpus: {meta['num_tokens']} tokens from {meta['num_files']} files "
          f"(Python {meta['python_version']}) -> {_CACHE.value}")


if __name__ == "__main__":
    app.run(main)
