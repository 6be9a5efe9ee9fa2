"""Re-tap a drafter trained on the last target layer's raw output for the published tap convention.

A drafter's tap of the last target layer is transformers' `hidden_states[L]`, the final-normed
state `w * h / rms(h)` (docs/INTERFACES.md). A drafter whose `fc` was trained on `h` itself sees
`h @ K = rms(h) * (tap / w) @ K` for that tap's rows K of fc.kernel. `fold_final_norm` scales
those rows by `rms / w` for one scalar `rms`, the median of rms(h) over training windows
(`raw_last_layer_rms`): the fused context then equals the raw-tap drafter's exactly for a token
whose rms(h) is that median, and otherwise differs by the token's ratio to it on that tap's share
(the `hidden_norm` after fc absorbs a common scale of the whole row, not of one share).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax import model as tgt
from ddtree_jax.config import DrafterConfig, Kernels, ModelConfig


def raw_last_layer_rms(params, cfg: ModelConfig, tokens) -> np.ndarray:
    """tokens [B, T] (causal windows from position 0) -> [B, T] float64: the root mean square of
    the last decoder layer's output before the final norm, per token (xla kernels)."""
    tokens = jnp.asarray(tokens, jnp.int32)
    b, t = tokens.shape
    dtype = jax.tree_util.tree_leaves(params["embed_tokens"])[0].dtype
    cache = tgt.init_cache(cfg, b, t, dtype)
    last = f"layers_{cfg.num_hidden_layers - 1}"
    _, state = tgt.Decoder(cfg, dtype, Kernels(attn="xla", moe="xla")).apply(
        {"params": params}, tokens, jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t)),
        cache.kv, cache.lengths, jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (b, t, t)),
        jnp.full((b,), t, jnp.int32), (), "naive",
        capture_intermediates=lambda module, _: module.name == last)
    h = np.asarray(state["intermediates"][last]["__call__"][0][0], np.float64)
    return np.sqrt(np.mean(h * h, axis=-1))


def fold_final_norm(dcfg: DrafterConfig, dparams: dict, tcfg: ModelConfig, tparams: dict,
                    rms: float) -> dict:
    """The drafter's params with fc's rows for the last target layer's tap scaled by
    rms / norm.scale (the target's final norm), every other leaf unchanged; ValueError if the
    drafter does not tap that layer, or rms is not a positive finite number."""
    last = tcfg.num_hidden_layers - 1
    if last not in dcfg.target_layer_ids:
        raise ValueError(f"the drafter taps layers {list(dcfg.target_layer_ids)}, not the target's "
                         f"last layer {last}: nothing to re-tap")
    if not (np.isfinite(rms) and rms > 0):
        raise ValueError(f"rms must be a positive finite number, got {rms!r}")
    d = dcfg.hidden_size
    k = dcfg.target_layer_ids.index(last)
    kernel = np.asarray(dparams["fc"]["kernel"], np.float64)            # [len(taps) * d, d]
    scale = rms / np.asarray(tparams["norm"]["scale"], np.float64)      # [d]
    kernel[k * d:(k + 1) * d] *= scale[:, None]
    dtype = dparams["fc"]["kernel"].dtype
    return {**dparams, "fc": {**dparams["fc"], "kernel": jnp.asarray(kernel, dtype)}}
