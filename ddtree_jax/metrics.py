"""Speculative decoding metrics from what a decode records (`GenerateResult.metrics()`), float64.

Per (stream, step) the engine records the accept length a: the tokens the step emitted before
any stop token or max_new_tokens cut them, 1 + the draft depth the target accepted, in
[1, max_length] (max_length: the drafter's block size; 1 for ar).

- mean accept length: the mean of a over all (stream, step) pairs; tau, SGLang's "average accept
  length".
- acceptance histogram [max_length + 1] int64: entry k counts the steps of accept length k
  (entry 0 is 0).
- acceptance rate by depth [max_length - 1]: entry d - 1 is, of the steps that reached depth
  d - 1 (a >= d), the fraction that accepted depth d (a >= d + 1); NaN where no step reached it.
- accepted per verified: sum of a over the tokens the target verified, nodes per stream per step
  (root included: ar 1, a chain block_size, a tree budget + 1; under a shared budget each step's
  own draft nodes + 1); 1 for ar.
- time to first token (TTFT) and time per output token (TPOT) per stream or request, from the
  times of its first and last token since the start: TPOT = (last - first) / (tokens - 1), for
  streams of two tokens or more; `percentiles` of each (p50 / p90 / p99, linear interpolation).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

PERCENTILES = (50, 90, 99)


def _lengths(acceptance_lengths: Sequence[Sequence[int]], max_length: int) -> np.ndarray:
    """Every stream's accept lengths, flattened to int64 [N]; ValueError outside [1, max_length]."""
    rows = [np.asarray(a, np.int64).reshape(-1) for a in acceptance_lengths]
    flat = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    bad = flat[(flat < 1) | (flat > max_length)]
    if bad.size:
        raise ValueError(f"acceptance_lengths must lie in [1, {max_length}], got {bad[:8].tolist()}")
    return flat


def mean_accept_length(acceptance_lengths: Sequence[Sequence[int]]) -> float:
    """Mean accept length over all (stream, step) pairs (tau); 0.0 with no steps."""
    rows = [np.asarray(a, np.float64).reshape(-1) for a in acceptance_lengths]
    flat = np.concatenate(rows) if rows else np.zeros(0)
    return float(flat.mean()) if flat.size else 0.0


def acceptance_histogram(acceptance_lengths: Sequence[Sequence[int]], max_length: int) -> np.ndarray:
    """[max_length + 1] int64: entry k counts the steps of accept length k."""
    return np.bincount(_lengths(acceptance_lengths, max_length), minlength=max_length + 1)


def acceptance_rate_by_depth(acceptance_lengths: Sequence[Sequence[int]], max_length: int) -> np.ndarray:
    """[max_length - 1] float64: entry d - 1 = #(a >= d + 1) / #(a >= d), NaN where #(a >= d) is 0."""
    reached = np.cumsum(acceptance_histogram(acceptance_lengths, max_length)[::-1])[::-1]  # #(a >= k)
    return np.where(reached[1:-1] > 0, reached[2:] / np.maximum(reached[1:-1], 1), np.nan)


def accepted_per_verified(acceptance_lengths: Sequence[Sequence[int]], verified) -> float:
    """Emitted tokens per token the target verified: sum(a) / the verified tokens. verified: an int,
    the tokens each stream verifies per step (root included), or one count per (stream, step) like
    acceptance_lengths (a shared budget's trees differ per step: draft nodes + 1)."""
    rows = [np.asarray(a, np.float64).reshape(-1) for a in acceptance_lengths]
    flat = np.concatenate(rows) if rows else np.zeros(0)
    if isinstance(verified, (int, np.integer)):
        if verified < 1:
            raise ValueError(f"verified must be >= 1, got {verified}")
        total = flat.size * int(verified)
    else:
        counts = [np.asarray(v, np.float64).reshape(-1) for v in verified]
        if [c.size for c in counts] != [r.size for r in rows]:
            raise ValueError("verified must hold one count per (stream, step) of acceptance_lengths; "
                             f"got {[c.size for c in counts]} against {[r.size for r in rows]}")
        total = float(sum(c.sum() for c in counts))
        if any((c < 1).any() for c in counts):
            raise ValueError("verified counts must be >= 1 (the root is always verified)")
    return float(flat.sum() / total) if flat.size else 0.0


def time_per_output_token(first_token_seconds: Sequence[float], last_token_seconds: Sequence[float],
                          num_tokens: Sequence[int]) -> np.ndarray:
    """[M] float64: (last - first) / (tokens - 1) of each stream with two tokens or more."""
    first, last = np.asarray(first_token_seconds, np.float64), np.asarray(last_token_seconds, np.float64)
    n = np.asarray(num_tokens, np.int64)
    if not first.shape == last.shape == n.shape:
        raise ValueError(f"first_token_seconds, last_token_seconds and num_tokens must have one entry "
                         f"per stream, got {first.shape}, {last.shape}, {n.shape}")
    keep = n >= 2
    return (last[keep] - first[keep]) / (n[keep] - 1)


def percentiles(values: Sequence[float], qs: Sequence[float] = PERCENTILES) -> dict:
    """{"mean", "p<q>" for q in qs} of `values` (linear interpolation); NaN for no values."""
    v = np.asarray(values, np.float64).reshape(-1)
    if not v.size:
        return {"mean": float("nan"), **{f"p{q:g}": float("nan") for q in qs}}
    return {"mean": float(v.mean()), **{f"p{q:g}": float(np.percentile(v, q)) for q in qs}}


def _json(x: float) -> float | None:
    return None if np.isnan(x) else float(x)


def summary(acceptance_lengths, max_length: int, verified, tokens: Sequence[Sequence[int]],
            first_token_seconds: Sequence[float] | None = None,
            last_token_seconds: Sequence[float] | None = None) -> dict:
    """Every metric above as plain floats, ints and lists, NaN as None (JSON-ready): keys
    mean_accept_length, acceptance_rate_by_depth, acceptance_histogram, accepted_per_verified
    and, given per-stream times, ttft_seconds and tpot_seconds (`percentiles` dicts); verified as
    `accepted_per_verified` takes it."""
    out = {"mean_accept_length": mean_accept_length(acceptance_lengths),
           "acceptance_rate_by_depth": [_json(r) for r in acceptance_rate_by_depth(acceptance_lengths,
                                                                                   max_length)],
           "acceptance_histogram": acceptance_histogram(acceptance_lengths, max_length).tolist(),
           "accepted_per_verified": accepted_per_verified(acceptance_lengths, verified)}
    if first_token_seconds is not None and last_token_seconds is not None:
        tpot = time_per_output_token(first_token_seconds, last_token_seconds, [len(t) for t in tokens])
        for key, values in (("ttft_seconds", first_token_seconds), ("tpot_seconds", tpot)):
            out[key] = {k: _json(v) for k, v in percentiles(values).items()}
    return out
