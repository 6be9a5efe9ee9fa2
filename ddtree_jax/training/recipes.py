"""The two training runs (experiments/train_target.py, experiments/train_drafter.py), each per an
ml_collections config (configs/train_*.py): Orbax checkpoints under a work dir (resumable),
summary.json and loss.png there, and the trained model exported in the HF layout.

train_target: a small Kimi-K2-architecture target on the stdlib corpus, next-token cross-entropy.
train_drafter: a DFlash drafter for a frozen target (the DFlash recipe): per batch one causal
target forward (no cache) gives the taps; `anchors_per_seq` random anchors per sequence each get a
block [token at anchor, MASK x (B-1)] that sees the context strictly before the anchor plus its own
block; cross-entropy on slots 1..B-1 against the true next tokens (or, with labels="target", the
target's greedy tokens after the true prefix), weighted by exp(-(k-1)/gamma). The drafter uses the
target's embedding and lm_head (frozen). Its text: windows of the stdlib corpus, or
(distill_data=path) rows of the target's own greedy continuations (experiments/distill_data.py).
init_from=dir starts from an exported drafter of the same architecture (fine-tuning; the run's own
schedule and optimizer state start fresh) instead of random weights.
"""

from __future__ import annotations

import functools
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax.atomic_io import write_json
from ddtree_jax.training import data, trainer
from ddtree_jax.checkpoint import load_target, save_target_hf
from ddtree_jax.config import DrafterConfig, ModelConfig
from ddtree_jax.drafter import init_drafter
from ddtree_jax.drafter_io import load_drafter, save_drafter
from ddtree_jax.model import init_target
from ddtree_jax.tokenizer import BOS, EOS, MASK, Tokenizer


def model_config(c, vocab_size: int) -> ModelConfig:
    ids = dict(vocab_size=vocab_size, bos_token_id=BOS, eos_token_id=EOS)
    if c.preset:
        return ModelConfig.preset(c.preset, **ids)
    return ModelConfig(**c.model.to_dict(), **ids)


def train_target(c, workdir: str, export_dir: str | None = None, show_progress: bool = True) -> dict:
    """Train (or resume) the target per config `c` (configs/train_target_*.py); returns the summary
    written to workdir/summary.json. show_progress: the loop's bar on a terminal."""
    tok = Tokenizer.load(c.tokenizer)
    tokens, meta = data.build_corpus(tok, c.tokenizer, c.corpus_cache, c.corpus_max_files, show_progress)
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
        budget_s=c.time_budget_s, ckpt_every=c.ckpt_every, log_every=c.log_every, name="target",
        show_progress=show_progress)
    run.close()
    total = int(state["total_steps"])
    losses = state["losses"][:total]
    summary = {"model": cfg.to_hf(), "steps": total, "tokens_per_step": c.batch_size * c.seq_len,
               "final_loss": float(losses[-min(50, total):].mean()), "loop_seconds": time.perf_counter() - t0,
               "device": jax.devices()[0].device_kind, "data": meta, "config": c.to_dict(),
               "command": " ".join(sys.argv)}
    write_json(os.path.join(workdir, "summary.json"), summary, indent=2, default=str)
    if export_dir:
        save_target_hf(export_dir, cfg, trainer.cast_params(state["params"], c.export_dtype))
    trainer.plot_losses(losses, os.path.join(workdir, "loss.png"), "target: next-token cross-entropy")
    print(f"target: {total} steps, final loss {summary['final_loss']:.4f}", flush=True)
    return summary


def drafter_config(c, tcfg) -> DrafterConfig:
    extra = {"target_layer_ids": tuple(c.target_layer_ids)} if c.target_layer_ids else {}
    return DrafterConfig.for_target(tcfg, num_hidden_layers=c.num_hidden_layers, block_size=c.block_size,
                                    mask_token_id=MASK, **extra)


def initial_params(c, dcfg: DrafterConfig) -> tuple[dict, dict | None]:
    """float32 params to start from: random, or the drafter exported at c.init_from (which must
    have the run's architecture) -> (params, None or {"path", "sha256"} of the weights file)."""
    if not c.init_from:
        return init_drafter(dcfg, jax.random.key(c.seed), jnp.float32), None
    icfg, params = load_drafter(c.init_from, dtype=jnp.float32)
    want, got = dcfg.to_hf(), icfg.to_hf()
    diff = sorted(k for k in want.keys() | got.keys() if want.get(k) != got.get(k))
    if diff:
        raise ValueError(f"init_from {c.init_from!r}: its drafter config differs from this run's in "
                         + ", ".join(f"{k} ({got.get(k)!r} there, {want.get(k)!r} here)" for k in diff))
    names = ("model.safetensors", "model.safetensors.index.json")   # single file, or sharded
    weights = next(os.path.join(c.init_from, n) for n in names
                   if os.path.isfile(os.path.join(c.init_from, n)))
    return params, {"path": os.path.abspath(c.init_from), "sha256": data.file_sha256(weights)}


def train_drafter(c, workdir: str, export_dir: str | None = None, show_progress: bool = True) -> dict:
    """Train (or resume) the drafter per config `c` (configs/train_drafter_*.py); returns the
    summary written to workdir/summary.json. show_progress: the loop's bar on a terminal."""
    tok = Tokenizer.load(c.tokenizer)
    if c.distill_data:
        rows, meta = data.load_sequences(c.distill_data)
        sample = functools.partial(data.sample_rows, rows, c.batch_size, c.seq_len)
    else:
        tokens, meta = data.build_corpus(tok, c.tokenizer, c.corpus_cache, c.corpus_max_files,
                                         show_progress)
        sample = functools.partial(data.sample_batch, tokens, c.batch_size, c.seq_len)
    tcfg, tparams = load_target(c.target, dtype=jnp.float32)
    dcfg = drafter_config(c, tcfg)
    tx = trainer.adamw(c.b1, c.b2, c.weight_decay, c.clip)

    @jax.jit
    def step_fn(params, opt_state, batch, step, total, tparams):
        key = jax.random.fold_in(jax.random.key(c.seed), step)
        (loss, metrics), grads = jax.value_and_grad(trainer.drafter_loss, has_aux=True)(
            params, tparams, dcfg, tcfg, batch, key, c.anchors_per_seq, c.gamma, c.labels)
        updates, opt_state = tx.update(grads, opt_state, params)
        lr = trainer.learning_rate(step, total, c.lr, c.warmup)
        return (trainer.apply_updates(params, updates, lr), opt_state, loss,
                {"acc1": metrics["slot_acc"][0], "tau_data": metrics["tau_data"]})

    params, init = initial_params(c, dcfg)
    fresh = dict(params=params, opt_state=tx.init(params), step=np.int32(0),
                 total_steps=np.int32(c.steps), losses=np.zeros(c.steps, np.float32))
    run = trainer.Trainer(workdir)
    t0 = time.perf_counter()
    state = trainer.train_loop(
        run, run.restore_or(fresh), lambda *a: step_fn(*a, tparams),
        functools.partial(sample, c.seed + 1),
        budget_s=c.time_budget_s, ckpt_every=c.ckpt_every, log_every=c.log_every, name="drafter",
        show_progress=show_progress)
    run.close()
    total = int(state["total_steps"])
    losses = state["losses"][:total]
    eval_batch = sample(c.seed + 2, 0)
    _, metrics = jax.jit(trainer.drafter_loss, static_argnums=(2, 3, 6, 7, 8))(
        state["params"], tparams, dcfg, tcfg, eval_batch, jax.random.key(c.seed + 2),
        c.anchors_per_seq, c.gamma, c.labels)
    summary = {"drafter": dcfg.to_hf(), "target": os.path.abspath(c.target), "steps": total,
               "final_loss": float(losses[-min(50, total):].mean()),
               "slot_accuracy": [float(a) for a in metrics["slot_acc"]],
               "tau_on_data": float(metrics["tau_data"]), "loop_seconds": time.perf_counter() - t0,
               "device": jax.devices()[0].device_kind, "data": meta, "config": c.to_dict(),
               "init": init,
               "command": " ".join(sys.argv)}
    write_json(os.path.join(workdir, "summary.json"), summary, indent=2, default=str)
    if export_dir:
        save_drafter(export_dir, dcfg, trainer.cast_params(state["params"], c.export_dtype))
    trainer.plot_losses(losses, os.path.join(workdir, "loss.png"),
                         f"drafter: DFlash loss (block {dcfg.block_size}, gamma {c.gamma:g})")
    print(f"drafter: {total} steps, final loss {summary['final_loss']:.4f}, "
          f"tau on data {summary['tau_on_data']:.2f}", flush=True)
    return summary
