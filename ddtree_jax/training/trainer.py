"""Training utilities shared by the target's and the drafter's runs (recipes.py).

- AdamW (optax transforms) with the learning rate applied outside, so the warmup + cosine schedule
  can be fixed after timing the first steps (`fit_steps`) and survives a restart.
- Losses: the target's next-token cross-entropy; the DFlash drafter loss over many anchors per
  sequence (`drafter_train_hidden`: every anchor's block sees the context strictly before it plus
  its own block, through the drafter's own modules).
- `Trainer`: Orbax checkpoints of {params, opt_state, step, total_steps, losses} in a work dir,
  resume from the latest; `train_loop`: a progress bar with an ETA on a terminal
  (ddtree_jax.progress) and a log line every `log_every` steps; the loss curve as PNG.
"""

from __future__ import annotations

import math
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp

from ddtree_jax import drafter as dft
from ddtree_jax.plotting import new_figure, save_png
from ddtree_jax import engine
from ddtree_jax import progress
from ddtree_jax import model as tgt
from ddtree_jax.config import DrafterConfig, ModelConfig


# ---- optimizer -------------------------------------------------------------------------------

def adamw(b1: float, b2: float, weight_decay: float, clip: float) -> optax.GradientTransformation:
    """Clipped Adam directions plus decoupled weight decay on matrices; multiply by -lr to apply."""
    decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
    return optax.chain(optax.clip_by_global_norm(clip), optax.scale_by_adam(b1, b2),
                       optax.add_decayed_weights(weight_decay, decay_mask))


def learning_rate(step, total: int, peak: float, warmup: int, final_frac: float = 0.1):
    """Linear warmup to `peak`, then cosine decay to `final_frac * peak` at `total`."""
    step, total = jnp.asarray(step, jnp.float32), jnp.asarray(total, jnp.float32)
    warm = peak * (step + 1) / max(warmup, 1)
    frac = jnp.clip((step - warmup) / jnp.maximum(total - warmup, 1.0), 0.0, 1.0)
    cos = peak * (final_frac + (1 - final_frac) * 0.5 * (1 + jnp.cos(math.pi * frac)))
    return jnp.where(step < warmup, warm, cos)


def apply_updates(params, updates, lr):
    return jax.tree.map(lambda p, u: (p - lr * u).astype(p.dtype), params, updates)


def cast_params(params, dtype):
    """Every float leaf in `dtype`, except the router's float32 e_score_correction_bias."""
    def cast(path, p):
        keep = jax.tree_util.keystr(path).endswith("['e_score_correction_bias']")
        return p if keep else jnp.asarray(p, dtype)
    return jax.tree_util.tree_map_with_path(cast, params)


# ---- target ----------------------------------------------------------------------------------

def target_loss(params, cfg: ModelConfig, tokens):
    """Mean next-token cross-entropy of tokens [B, T+1] (one causal forward of the first T)."""
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    b, t = inputs.shape
    dtype = jax.tree_util.tree_leaves(params["embed_tokens"])[0].dtype
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    out = tgt.forward(params, cfg, inputs, positions, tgt.init_cache(cfg, b, t, dtype),
                      attn_mode="naive", attn_impl="xla", moe_impl="xla")
    return optax.softmax_cross_entropy_with_integer_labels(out.logits, labels).mean()


def target_taps(params, cfg: ModelConfig, tokens, taps):
    """One causal forward, no gradient: (tapped hidden states [B, T, len(taps)*d], the target's
    greedy next token after each position [B, T])."""
    b, t = tokens.shape
    dtype = jax.tree_util.tree_leaves(params["embed_tokens"])[0].dtype
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    out = tgt.forward(params, cfg, tokens, positions, tgt.init_cache(cfg, b, t, dtype),
                      taps=tuple(taps), attn_mode="naive", attn_impl="xla", moe_impl="xla")
    return jax.lax.stop_gradient(out.taps), jnp.argmax(out.logits, axis=-1).astype(jnp.int32)


def greedy_continuations(target, prompts: np.ndarray, new_tokens: int, streams: int,
                         show_progress: bool = True) -> np.ndarray:
    """prompts int [N, P] -> [N, P + new_tokens]: each prompt and the target's greedy continuation
    (engine method "ar", `streams` prompts per generate call); the drafter's distillation data.
    show_progress: a bar over the calls on a terminal (ddtree_jax.progress)."""
    rows = []
    for i in progress.track(range(0, len(prompts), streams), "distill", show_progress):
        batch = prompts[i:i + streams]
        r = engine.generate(target, None, batch.tolist(), method="ar", max_new_tokens=new_tokens,
                            stage_reps=0)
        gen = np.asarray([t[:new_tokens] for t in r.tokens], np.int64)
        if gen.shape != (len(batch), new_tokens):
            raise RuntimeError(f"generate returned {gen.shape} tokens, expected {(len(batch), new_tokens)}")
        rows.append(np.concatenate([batch, gen], axis=1))
        print(f"distill: {i + len(batch)}/{len(prompts)} sequences, "
              f"{r.tokens_per_second:.0f} tok/s", flush=True)
    return np.concatenate(rows)


# ---- drafter ---------------------------------------------------------------------------------

def drafter_train_hidden(params, cfg: DrafterConfig, taps, block_emb, anchors):
    """Many anchors per sequence in one drafter forward.

    taps [B, T, len(ids)*d] of the whole sequence, block_emb [B, A, b, d] (block a = [token at
    anchor, MASK x (b-1)] embedded), anchors [B, A] int32 -> final-normed hidden [B, A, b, d].
    Anchor a's block (positions a..a+b-1) attends to context positions < a and to its own block,
    exactly as `drafter_hidden` with the context taps[:, :a].
    """
    bsz, t = taps.shape[:2]
    n_anchor, blk = anchors.shape[1], block_emb.shape[2]
    model = dft.DFlashDrafter(cfg)
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (bsz, t))
    k, v = model.apply({"params": params}, taps, positions, method="context_kv")    # [L,B,KV,T,hd]
    k, v = (jnp.repeat(x, n_anchor, axis=1) for x in (k, v))
    flat_anchor = anchors.reshape(-1)
    block_pos = flat_anchor[:, None] + jnp.arange(blk, dtype=jnp.int32)[None, :]
    hidden = model.apply({"params": params}, block_emb.reshape(bsz * n_anchor, blk, -1), block_pos,
                         k, v, flat_anchor)
    return hidden.reshape(bsz, n_anchor, blk, -1)


def sample_anchors(key, batch: int, seq_len: int, block: int, count: int):
    """[batch, count] distinct anchors per row in [1, seq_len - block] (each block fits the row)."""
    scores = jax.random.uniform(key, (batch, seq_len - block))
    return (jnp.argsort(scores, axis=1)[:, :count] + 1).astype(jnp.int32)


def drafter_loss(dparams, tparams, dcfg: DrafterConfig, tcfg: ModelConfig, tokens, key,
                 anchors_per_seq: int, gamma: float, labels: str = "data"):
    """DFlash loss on tokens [B, T]: cross-entropy of block slots 1..b-1, weighted by
    exp(-(k-1)/gamma) and normalised by the weights, against the true next tokens
    (labels="data") or the target's greedy choice after the true prefix (labels="target").
    Returns (loss, metrics) with the per-slot accuracy and the mean accepted length along the
    labels (1 + leading hits)."""
    if labels not in ("data", "target"):
        raise ValueError(f"labels must be 'data' or 'target', got {labels!r}")
    bsz, t = tokens.shape
    blk = dcfg.block_size
    taps, greedy = target_taps(tparams, tcfg, tokens, dcfg.target_layer_ids)
    anchors = sample_anchors(key, bsz, t, blk, anchors_per_seq)
    idx = anchors[..., None] + jnp.arange(blk)                                      # [B, A, b]
    block_tokens = jnp.take_along_axis(tokens, idx.reshape(bsz, -1), axis=1).reshape(idx.shape)
    blocks = jnp.where(jnp.arange(blk) == 0, block_tokens, dcfg.mask_token_id)
    emb = tparams["embed_tokens"]["embedding"][blocks]
    hidden = drafter_train_hidden(dparams, dcfg, taps, emb, anchors)
    logits = dft.draft_logits(tparams, hidden[:, :, 1:])                           # [B, A, b-1, V]
    if labels == "data":
        targets = block_tokens[:, :, 1:]
    else:                                  # the target's choice for position a+k, from a+k-1
        targets = jnp.take_along_axis(greedy, idx[..., :-1].reshape(bsz, -1), axis=1).reshape(
            bsz, -1, blk - 1)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    w = jnp.exp(-jnp.arange(blk - 1, dtype=jnp.float32) / gamma)
    loss = (ce * w).mean(axis=(0, 1)).sum() / w.sum()
    hit = jnp.argmax(logits, axis=-1) == targets
    accepted = jnp.cumprod(hit, axis=-1).sum(-1)
    return loss, {"slot_acc": hit.mean(axis=(0, 1)), "tau_data": 1.0 + accepted.mean()}


# ---- loop plumbing ---------------------------------------------------------------------------

class Trainer:
    """Checkpointed state {params, opt_state, step, total_steps, losses} in `workdir`/checkpoints."""

    def __init__(self, workdir: str, keep: int = 2):
        self.workdir = os.path.abspath(workdir)
        os.makedirs(self.workdir, exist_ok=True)
        self.manager = ocp.CheckpointManager(os.path.join(self.workdir, "checkpoints"),
                                             options=ocp.CheckpointManagerOptions(max_to_keep=keep))

    def restore_or(self, fresh: dict) -> dict:
        """The latest checkpoint (arrays shaped like `fresh`), or `fresh` when there is none; the
        loss history is padded or cut to fresh["losses"]'s length."""
        step = self.manager.latest_step()
        if step is None:
            return fresh
        arrays = {k: v for k, v in fresh.items() if k != "losses"}
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), arrays)
        got = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), losses=ocp.args.JsonRestore()))
        losses = np.zeros_like(fresh["losses"])
        saved = np.asarray(got.losses, np.float32)[:losses.size]
        losses[:saved.size] = saved
        print(f"resumed from {self.workdir} at step {int(got.state['step'])}", flush=True)
        return dict(got.state, losses=losses)

    def save(self, state: dict) -> None:
        arrays = {k: v for k, v in state.items() if k != "losses"}
        losses = [float(x) for x in state["losses"][:int(state["step"])]]
        self.manager.save(int(state["step"]), force=True, args=ocp.args.Composite(
            state=ocp.args.StandardSave(arrays), losses=ocp.args.JsonSave(losses)))
        self.manager.wait_until_finished()

    def close(self):
        self.manager.close()


def fit_steps(max_steps: int, done: int, sec_per_step: float, elapsed: float, budget_s: float) -> int:
    """Total steps that fit a wall-clock budget (0 = no budget), at least `done`, at most max_steps."""
    if budget_s <= 0:
        return max_steps
    return int(min(max_steps, max(done, done + (budget_s - elapsed) / max(sec_per_step, 1e-9))))


def train_loop(trainer: Trainer, state: dict, step_fn, batch_fn, *, budget_s: float, ckpt_every: int,
               log_every: int, name: str, time_steps: int = 8, show_progress: bool = True) -> dict:
    """Run `state` to its total_steps (or fewer fitting `budget_s` of wall time, fixed once after
    timing `time_steps` steps of a fresh run) with checkpoints every `ckpt_every` steps and at the
    end; without a budget the total is len(state["losses"]) (the configured steps, also on resume).
    step_fn(params, opt_state, batch, step, total) -> (params, opt_state, loss, metrics);
    batch_fn(step) -> the batch. show_progress: the bar on a terminal (`progress.bar`). Returns the
    final state; state["losses"][:total_steps] is filled."""
    losses = np.asarray(state["losses"]).copy()
    step = int(state["step"])
    total = int(state["total_steps"]) if budget_s > 0 else losses.size
    fit_pending = step == 0 and budget_s > 0
    start = time.perf_counter()
    log = LogLines(log_every, name)
    params, opt_state, pending, t_timed = state["params"], state["opt_state"], [], None
    with progress.bar(total, name, show_progress, initial=step) as bar:
        while step < total:
            params, opt_state, loss, metrics = step_fn(params, opt_state, batch_fn(step), step, total)
            pending.append((step, loss))
            step += 1
            bar.update()
            if fit_pending and step in (1, 1 + time_steps):
                jax.block_until_ready(loss)
                if step == 1:
                    t_timed = time.perf_counter()
                else:
                    per = (time.perf_counter() - t_timed) / time_steps
                    total = fit_steps(total, step, per, time.perf_counter() - start, budget_s)
                    bar.total = total
                    print(f"{name}: {per * 1e3:.1f} ms/step after compile; {total} steps fit the "
                          f"{budget_s:.0f} s budget", flush=True)
                    fit_pending = False
            if step % log_every == 0 or step == total or step % ckpt_every == 0:
                for s, l in jax.device_get(pending):
                    losses[s] = l
                pending = []
                extra = {k: float(np.mean(v)) for k, v in jax.device_get(metrics).items()}
                log.update(step, total, float(losses[step - 1]), **extra)
                bar.set_postfix(loss=f"{losses[step - 1]:.4f}")
            if step % ckpt_every == 0 or step == total:
                state = dict(params=params, opt_state=opt_state, step=np.int32(step),
                             total_steps=np.int32(total), losses=losses)
                trainer.save(state)
    return dict(params=params, opt_state=opt_state, step=np.int32(step), total_steps=np.int32(total),
                losses=losses)


class LogLines:
    """One line per `every` steps (and the last): step/total, loss, extra metrics, steps/s, ETA."""

    def __init__(self, every: int, name: str):
        self.every, self.name, self.t0, self.s0 = every, name, time.perf_counter(), None

    def update(self, step: int, total: int, loss: float, **extra) -> None:
        if self.s0 is None:                    # the first call (compile included) sets the clock
            self.s0, self.t0 = step, time.perf_counter()
        elif step % self.every and step != total:
            return
        rate = (step - self.s0) / max(time.perf_counter() - self.t0, 1e-9)
        more = " ".join(f"{k}={v:.3f}" for k, v in extra.items())
        eta = f"{(total - step) / rate:.0f}s" if rate > 0 else "?"
        print(f"{self.name} {step}/{total} loss={loss:.4f} {more} {rate:.1f} it/s eta {eta}",
              file=sys.stdout, flush=True)


def plot_losses(losses: np.ndarray, path: str | None, title: str):
    """Raw loss per step and its moving average -> the Figure (None without matplotlib, the [plots]
    extra), also written as a PNG at `path` unless None (ddtree_jax.plotting)."""
    fig = new_figure(path, figsize=(6, 3.5), dpi=120, layout="tight")
    if fig is None:
        return None
    ax = fig.subplots()
    steps = np.arange(1, losses.size + 1)
    ax.plot(steps, losses, lw=0.6, alpha=0.4, label="per step")
    k = max(1, losses.size // 50)
    if losses.size >= k:
        smooth = np.convolve(losses, np.ones(k) / k, mode="valid")
        ax.plot(steps[k - 1:], smooth, lw=1.5, label=f"mean of {k}")
    ax.set(xlabel="step", ylabel="loss (nats/token)", title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    if path is not None:
        save_png(fig, path, dpi=120)
    return fig
