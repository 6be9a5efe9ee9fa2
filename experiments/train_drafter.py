"""Train a DFlash drafter for a frozen target of the framework (the DFlash recipe).

  python experiments/train_drafter.py --config=configs/train_drafter_small.py \
      --workdir=runs/drafter [--export_dir=assets/pair/drafter] [--config.key=value ...]

Training text: windows of the stdlib corpus, or (--config.distill_data=path) rows of the target's
own greedy continuations from experiments/distill_data.py.
Per batch: one causal target forward (no cache) gives the taps; `anchors_per_seq` random anchors
per sequence each get a block [token at anchor, MASK x (B-1)] that sees the context strictly before
the anchor plus its own block; cross-entropy on slots 1..B-1 against the true next tokens (or, with
--config.labels=target, the target's greedy tokens after the true prefix), weighted by
exp(-(k-1)/gamma). The drafter uses the target's embedding and lm_head (frozen).
--config.init_from=dir starts from an exported drafter of the same architecture (fine-tuning;
the run's own schedule and optimizer state start fresh) instead of random weights. Orbax
checkpoints under --workdir (resumable), summary.json there; --export_dir writes the z-lab HF
layout (`save_drafter`); then loss.png in the work dir (with matplotlib, the [plots] extra).
"""

from __future__ import annotations

from absl import app, flags, logging
from ml_collections import config_flags

from ddtree_jax import progress
from ddtree_jax.training import recipes

config_flags.DEFINE_config_file("config", None, "configs/train_drafter_*.py", lock_config=True)
flags.DEFINE_string("workdir", "runs/drafter", "checkpoints, loss.png, summary.json")
flags.DEFINE_string("export_dir", None, "write the trained drafter here (HF layout)")
_PROGRESS = progress.flag()


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    recipes.train_drafter(flags.FLAGS.config, flags.FLAGS.workdir, flags.FLAGS.export_dir,
                          show_progress=_PROGRESS.value)


if __name__ == "__main__":
    app.run(main)
