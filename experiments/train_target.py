"""Train a small Kimi-K2-architecture target on the stdlib corpus (next-token cross-entropy).

  python experiments/train_target.py --config=configs/train_target_small.py \
      --workdir=runs/target [--export_dir=assets/pair/target] [--config.key=value ...]

The loop checkpoints {params, AdamW state, step, losses} with Orbax under --workdir and a restart
continues from the latest checkpoint. Writes summary.json in the work dir; with --export_dir, the
target in the HF layout (`save_target_hf`) that `load_target` reads; then loss.png in the work dir
(with matplotlib, the [plots] extra).
"""

from __future__ import annotations

import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags, logging
from ml_collections import config_flags

from ddtree_jax.training import data, trainer
from ddtree_jax.checkpoint import save_target_hf
from ddtree_jax.config import ModelConfig
from ddtree_jax.model import init_target
from ddtree_jax.tokenizer import BOS, EOS, Tokenizer


def model_config(c, vocab_size: int) -> ModelConfig:
    ids = dict(vocab_size=vocab_size, bos_token_id=BOS, eos_token_id=EOS)
    if c.preset:
        return ModelConfig.preset(c.preset, **ids)
    return ModelConfig(**c.model.to_dict(), **ids)


def train(c, workdir: str, export_dir: str | None = None) -> dict:
    """Train (or resume) per config `c`; returns the summary written to workdir/summary.json."""
    tok = Tokenizer.load(c.tokenizer)
    tokens, meta = data.build_corpus(tok, c.tokenizer, c.corpus_cache, c.corpus_max_files)
    cfg = model_config(c, tok.vocab_size)
    tx = trainer.adamw(c.b1, c.b2, c.weight_decay, c.clip)

    @jax.jit
    def step_fn(params, opt_state, batch, step, total):
        loss, grads = jax.value_and_grad(trainer.target_loss)(params, cfg, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        lr = trainer.learning_rate(step, total, c.lr, c.warmup)
        return trainer.apply_updates(params, updates, lr), opt_state, loss, {}

    params = init_target(cfg, jax.random.key(c.seed), jnp.float32)
    fresh = dict(params=params, opt_state=tx.init(params), step=np.int32(0),
                 total_steps=np.int32(c.steps), losses=np.zeros(c.steps, np.float32))
    run = trainer.Trainer(workdir)
    t0 = time.perf_counter()
    state = trainer.train_loop(
        run, run.restore_or(fresh), step_fn,
        lambda s: data.sample_batch(tokens, c.batch_size, c.seq_len + 1, c.seed, s),
        budget_s=c.time_budget_s, ckpt_every=c.ckpt_every, log_every=c.log_every, name="target")
    run.close()
    total = int(state["total_steps"])
    losses = state["losses"][:total]
    summary = {"model": cfg.to_hf(), "steps": total, "tokens_per_step": c.batch_size * c.seq_len,
               "final_loss": float(losses[-min(50, total):].mean()), "loop_seconds": time.perf_counter() - t0,
               "device": jax.devices()[0].device_kind, "data": meta, "config": c.to_dict(),
               "command": " ".join(sys.argv)}
    with open(os.path.join(workdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, default=str)
    if export_dir:
        save_target_hf(export_dir, cfg, trainer.cast_params(state["params"], c.export_dtype))
    trainer.plot_losses(losses, os.path.join(workdir, "loss.png"), "target: next-token cross-entropy")
    print(f"target: {total} steps, final loss {summary['final_loss']:.4f}", flush=True)
    return summary


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    train(flags.FLAGS.config, flags.FLAGS.workdir, flags.FLAGS.export_dir)


if __name__ == "__main__":
    config_flags.DEFINE_config_file("config", None, "configs/train_target_*.py", lock_config=True)
    flags.DEFINE_string("workdir", "runs/target", "checkpoints, loss.png, summary.json")
    flags.DEFINE_string("export_dir", None, "write the trained target here (HF layout)")
    app.run(main)
