"""Train a small Kimi-K2-architecture target on the stdlib corpus (next-token cross-entropy).

  python experiments/train_target.py --config=configs/train_target_small.py \
      --workdir=runs/target [--export_dir=assets/pair/target] [--config.key=value ...]

The loop checkpoints {params, AdamW state, step, losses} with Orbax under --workdir and a restart
continues from the latest checkpoint. Writes summary.json in the work dir; with --export_dir, the
target in the HF layout (`save_target_hf`) that `load_target` reads; then loss.png in the work dir
(with matplotlib, the [plots] extra).
"""

from __future__ import annotations

from absl import app, flags, logging
from ml_collections import config_flags

from ddtree_jax import progress
from ddtree_jax.training import recipes

config_flags.DEFINE_config_file("config", None, "configs/train_target_*.py", lock_config=True)
flags.DEFINE_string("workdir", "runs/target", "checkpoints, loss.png, summary.json")
flags.DEFINE_string("export_dir", None, "write the trained target here (HF layout)")
_PROGRESS = progress.flag()


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    recipes.train_target(flags.FLAGS.config, flags.FLAGS.workdir, flags.FLAGS.export_dir,
                         show_progress=_PROGRESS.value)


if __name__ == "__main__":
    app.run(main)
