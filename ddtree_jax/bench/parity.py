"""Checks that a benchmarked path computes what its reference computes, run before its numbers are
reported: greedy speculative decoding against plain greedy decoding (ar), and a sharded program
against the same program on one device.

Greedy decoding is exact only in exact arithmetic. In bf16 a stream can leave ar's tokens at a
near-tie in the target's logits, where the verify's batch shapes round differently from ar's (how
often: docs/shipped_pair.md, "Streams that part from ar"). `check_greedy` therefore accepts a stream
that differs from ar's only if, at its first differing token, the target's float32 logits (params
cast up, "highest" matmul precision) put the two tokens within TIE_REL x the row's largest |logit|
of each other; after that point the streams decode different contexts and are not compared.
TIE_REL = 5e-2: the shipped pair's bf16 logits lie within 0.21 (1.4% of the row's largest) of its
float32 logits on the CPU, and its bf16 divergences there are float32 ties within 0.008; a wrong
token of a trained target is typically nats below the argmax.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax.model import target_logits

TIE_REL = 5e-2
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
    cfg, params = target
    # one row per stream (those without a difference padded), all as long as the longest
    # prompt + ar's tokens: one compiled forward per (streams, length), whichever streams differ
    rows = np.zeros((len(want), max(len(p) + len(w) for p, w in zip(prompts, want))), np.int32)
    for s, i in split.items():
        rows[s, :len(prompts[s]) + i] = list(prompts[s]) + list(want[s][:i])
    up = jax.tree.map(lambda x: x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) else x,
                      params)
    with jax.default_matmul_precision("highest"):
        logits = np.asarray(target_logits(up, cfg, rows))
    for s, i in split.items():
        row = logits[s, len(prompts[s]) + i - 1]
        a, b = want[s][i], got[s][i]
        gap, tol = float(row[a] - row[b]), TIE_REL * float(np.abs(row).max())
        if abs(gap) > tol:
            raise AssertionError(
                f"{what}: stream {s} emits token {b} at position {i} where ar emits {a}; the target's "
                f"float32 logits differ by {gap:.3g} there, beyond a near-tie ({tol:.3g}): not lossless")
    return len(split)


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
