"""Checks that a benchmarked path computes what its reference computes, run before its numbers are
reported: greedy speculative decoding against plain greedy decoding (ar), and a sharded program
against the same program on one device.

Greedy decoding is exact only in exact arithmetic. In bf16 the verify step's batch shapes round a
token's activations differently from ar's step (both within bf16 of the float32 target), and the
target makes two kinds of discrete choice that such rounding can tip where the float32 target is at
a near-tie: the argmax of the logits, and each MoE layer's expert set (the top-k of the router's
selection scores). The first moves the emitted token between two near-equal logits; the second
swaps an expert, which in a small model moves the token's logits by up to ~20% of the row. So
`check_greedy` accepts a stream that differs from ar's only where, at its first differing token,
the target in float32 (params cast up, "highest" matmul precision) supports the emitted token
(`tie_reason`):
- "logits": the emitted token's logit is within TIE_REL x the row's largest |logit| of the
  expected one's, or above it (then the expected token is the one its own run rounded off);
- "routing at layer l": the token's k-th and (k+1)-th selection scores at MoE layer l lie within
  ROUTE_TIE, and with that tie resolved the other way (the (k+1)-th expert's bias raised just past
  the gap, which also re-resolves that layer's other choices within the same gap) the emitted
  token's logit is within TIE_REL of the expected one's or above it.
After that point the streams decode different contexts and are not compared.

TIE_REL = 5e-2: the shipped pair's bf16 logits lie within 0.21 (1.4% of the row's largest) of its
float32 logits on the CPU, and its bf16 logit divergences there are float32 ties within 0.008; a
wrong token of a trained target is typically nats below the argmax. ROUTE_TIE = 2e-2: bf16 moves
the shipped pair's selection scores by up to 9.5e-3 against float32 (99.9th percentile over the
held-out prompts, CPU), so the gap between two scores by up to about twice that. A wrong token is
accepted only if re-resolving such a tie makes the float32 target emit it.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax.model import routing_choices, target_logits

TIE_REL = 5e-2
ROUTE_TIE = 2e-2
# relative error ||got - want|| / ||want|| allowed between a sharded and an unsharded result:
# a few roundings per layer in bf16 (unit 2^-8) plus the odd routed token whose expert set flips
# at a near-tie; a sharding bug gives O(1)
SHARDED_TOL = {"bfloat16": 5e-2, "float32": 1e-3}


def check_greedy(target, prompts: Sequence[Sequence[int]], want: Sequence[Sequence[int]],
                 got: Sequence[Sequence[int]], what: str) -> int:
    """Greedy tokens `got` (per stream) against ar's `want` for the same `prompts`, on the target
    (config, params). -> the number of streams that left ar's tokens at a near-tie (see the module
    docstring); AssertionError naming `what`, the stream and the position for any other difference."""
    if len(got) != len(want) or len(prompts) != len(want):
        raise AssertionError(f"{what}: {len(got)} streams against ar's {len(want)} "
                             f"({len(prompts)} prompts)")
    split = {}   # stream -> first position where it differs from ar
    for s, (w, g) in enumerate(zip(want, got)):
        i = next((i for i, (a, b) in enumerate(zip(w, g)) if a != b), None)
        if i is None and len(w) != len(g):
            raise AssertionError(f"{what}: stream {s} emits {len(g)} tokens where ar emits {len(w)}")
        if i is not None:
            split[s] = i
    if not split:
        return 0
    cfg, up = target[0], _float32(target[1])     # cast once for every differing stream
    for s, i in split.items():
        prefix = list(prompts[s]) + list(want[s][:i])
        if _tie_reason(cfg, up, prefix, want[s][i], got[s][i]) is None:
            raise AssertionError(
                f"{what}: stream {s} emits token {got[s][i]} at position {i} where ar emits "
                f"{want[s][i]}; the float32 target is at no near-tie there (logits within TIE_REL, "
                f"or an expert choice within ROUTE_TIE that re-resolved emits it): not lossless")
    return len(split)


def _float32(params):
    return jax.tree.map(lambda x: x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating)
                        else x, params)


def _padded(prefix) -> np.ndarray:
    """[1, T] with the prefix first, T a multiple of 64 (the forward is causal: the padding after
    the prefix changes nothing before it, and few lengths keep the compilations few)."""
    row = np.zeros((1, -(-len(prefix) // 64) * 64), np.int32)
    row[0, :len(prefix)] = prefix
    return row


def _last_logits(params, cfg, prefix) -> np.ndarray:
    with jax.default_matmul_precision("highest"):
        return np.asarray(target_logits(params, cfg, _padded(prefix)))[0, len(prefix) - 1]


def _with_bias(params, layer: int, bias):
    """params with MoE layer `layer`'s router selection bias replaced (the nested dicts copied)."""
    name = f"layers_{layer}"
    mlp = params[name]["mlp"]
    gate = {**mlp["gate"], "e_score_correction_bias": bias}
    return {**params, name: {**params[name], "mlp": {**mlp, "gate": gate}}}


def _supports(row: np.ndarray, expected: int, emitted: int) -> bool:
    """The emitted token's logit is within TIE_REL x max|logit| of the expected one's, or above it."""
    return float(row[expected] - row[emitted]) <= TIE_REL * float(np.abs(row).max())


def tie_reason(target, prefix: Sequence[int], expected: int, emitted: int) -> str | None:
    """Why the target (config, params) may emit `emitted` where `expected` is greedy's after the
    tokens `prefix`, judged in float32 (see the module docstring): "logits", "routing at layer l",
    or None when the float32 target is at no near-tie there."""
    return _tie_reason(target[0], _float32(target[1]), prefix, expected, emitted)


def _tie_reason(cfg, up, prefix, expected: int, emitted: int) -> str | None:
    """tie_reason with the params `up` already in float32."""
    row = _last_logits(up, cfg, prefix)
    if _supports(row, expected, emitted):
        return "logits"
    for layer, gap, order in _routing_ties(cfg, up, prefix):
        bias = up[f"layers_{layer}"]["mlp"]["gate"]["e_score_correction_bias"]
        k = cfg.num_experts_per_tok
        raised = bias.at[order[k]].add(np.float32(gap + max(1e-6, 1e-3 * gap)))
        if _supports(_last_logits(_with_bias(up, layer, raised), cfg, prefix), expected, emitted):
            return f"routing at layer {layer}"
    return None


def _routing_ties(cfg, up, prefix):
    """(layer, gap, experts by score desc) for each MoE layer where the last token of `prefix`
    has its k-th and (k+1)-th selection scores within ROUTE_TIE (params `up` in float32)."""
    k = cfg.num_experts_per_tok
    with jax.default_matmul_precision("highest"):
        choices = routing_choices(up, cfg, _padded(prefix))
    for layer, choice in choices.items():
        last = np.asarray(choice[0, len(prefix) - 1], np.float64)
        order = np.argsort(-last, kind="stable")
        gap = last[order[k - 1]] - last[order[k]]
        if gap < ROUTE_TIE:
            yield layer, float(gap), order


def routing_tie_layers(target, prefix: Sequence[int]) -> list[int]:
    """The MoE layers at which the last token of `prefix` has an expert choice within ROUTE_TIE
    in the float32 target (its k-th and (k+1)-th selection scores): where bf16 rounding may
    swap one of its experts, changing its hidden state (and the cache entries of later layers)."""
    return [layer for layer, _, _ in _routing_ties(target[0], _float32(target[1]), prefix)]


def relative_error(got, want) -> float:
    """||got - want|| / ||want|| (Frobenius, in float64)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def check_sharded(what: str, got, want, dtype) -> float:
    """A sharded result `got` against the one-device `want`; -> their relative error, or
    AssertionError naming `what` when it exceeds SHARDED_TOL of `dtype` ("bfloat16", "float32")."""
    tol = SHARDED_TOL[jnp.dtype(dtype).name]
    err = relative_error(got, want)
    if not err <= tol:
        raise AssertionError(f"{what}: relative error {err:.3g} against the 1-device run exceeds "
                             f"{tol:g} ({jnp.dtype(dtype).name})")
    return err
