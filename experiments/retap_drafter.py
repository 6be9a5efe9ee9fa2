"""Re-tap a drafter trained on the last target layer's raw output for the published convention.

  python experiments/retap_drafter.py --drafter=assets/pair/drafter --target=assets/pair/target \
      --out=assets/pair/drafter --workdir=runs/retap

Measures the median RMS of the target's last-layer output (before the final norm) over
`--windows` training windows of `--seq_len` tokens (the held-out modules are never in them), folds
it and the final norm's scale into the drafter's fc (ddtree_jax.training.retap), writes the drafter
to --out and summary.json (command, source drafter sha256, the RMS statistics) to --workdir.
"""

from __future__ import annotations

import json
import os
import sys

import jax.numpy as jnp
import numpy as np
from absl import app, flags

from ddtree_jax.atomic_io import write_json
from ddtree_jax.checkpoint import load_target
from ddtree_jax.drafter_io import load_drafter, save_drafter
from ddtree_jax.tokenizer import Tokenizer
from ddtree_jax.training import data, retap

_DRAFTER = flags.DEFINE_string("drafter", "assets/pair/drafter", "drafter trained on the raw last-layer tap")
_TARGET = flags.DEFINE_string("target", "assets/pair/target", "its target checkpoint (HF layout)")
_OUT = flags.DEFINE_string("out", "assets/pair/drafter", "where the re-tapped drafter goes")
_WORK = flags.DEFINE_string("workdir", "runs/retap", "summary.json")
_TOK, _CACHE = data.corpus_flags()
_WINDOWS = flags.DEFINE_integer("windows", 256, "training windows the RMS is measured over")
_SEQ = flags.DEFINE_integer("seq_len", 256, "tokens per window")
_SEED = flags.DEFINE_integer("seed", 0, "window offsets")
_DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float32"], "the written drafter's dtype")


def main(argv):
    del argv
    if min(_WINDOWS.value, _SEQ.value) < 1:
        raise ValueError("windows and seq_len must be >= 1")
    tcfg, tparams = load_target(_TARGET.value, dtype=jnp.float32)
    dcfg, dparams = load_drafter(_DRAFTER.value, dtype=jnp.dtype(_DTYPE.value))
    source_sha = data.file_sha256(os.path.join(_DRAFTER.value, "model.safetensors"))
    stream, _ = data.build_corpus(Tokenizer.load(_TOK.value), _TOK.value, _CACHE.value, show_progress=False)
    windows = data.sample_batch(stream, _WINDOWS.value, _SEQ.value, _SEED.value, 0)
    rms = np.concatenate([retap.raw_last_layer_rms(tparams, tcfg, windows[i:i + 32])
                          for i in range(0, len(windows), 32)]).ravel()
    median = float(np.median(rms))
    out_params = retap.fold_final_norm(dcfg, dparams, tcfg, tparams, median)
    save_drafter(_OUT.value, dcfg, out_params)
    summary = {"command": "python " + " ".join(sys.argv), "source_drafter_sha256": source_sha,
               "median_rms": median, "rms_p5_p50_p95": np.percentile(rms, [5, 50, 95]).tolist(),
               "rms_std_over_mean": float(rms.std() / rms.mean()), "windows": _WINDOWS.value,
               "seq_len": _SEQ.value, "seed": _SEED.value}
    write_json(os.path.join(_WORK.value, "summary.json"), summary, indent=2)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    app.run(main)
