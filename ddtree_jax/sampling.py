"""Target-side token choice at every verified node: greedy, or a sample from the (optionally top-k /
top-p truncated) temperature-scaled target distribution. The speculative walk only ever emits
these tokens, which is what makes the method lossless."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from ddtree_jax.checks import check_int


@dataclasses.dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0   # 0: greedy
    top_k: int = 0             # 0: off
    top_p: float = 1.0         # 1: off

    def __post_init__(self):
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be finite and >= 0, got {self.temperature}")
        check_int("top_k", self.top_k, 0)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def target_log_probs(logits, sampling: Sampling):
    """logits [..., V] float32 -> log-probabilities [..., V] of the distribution tokens are drawn from
    (-inf outside the top-k / top-p set). Only meaningful when temperature > 0."""
    x = logits.astype(jnp.float32) / sampling.temperature
    if sampling.top_k:
        kth = jax.lax.top_k(x, min(sampling.top_k, x.shape[-1]))[0][..., -1:]
        x = jnp.where(x < kth, -jnp.inf, x)
    if sampling.top_p < 1:
        order = jnp.argsort(-x, axis=-1)
        sorted_p = jax.nn.softmax(jnp.take_along_axis(x, order, axis=-1), axis=-1)
        before = jnp.cumsum(sorted_p, axis=-1) - sorted_p       # mass strictly ahead of each token
        keep_sorted = before < sampling.top_p                   # the smallest set reaching top_p
        keep = jnp.zeros_like(keep_sorted).at[
            tuple(jnp.indices(order.shape)[:-1]) + (order,)].set(keep_sorted)
        x = jnp.where(keep, x, -jnp.inf)
    return jax.nn.log_softmax(x, axis=-1)


def choose(logits, key, sampling: Sampling):
    """logits [..., V] -> token ids [...] int32: argmax (greedy) or an independent sample per row."""
    if sampling.greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return jax.random.categorical(key, target_log_probs(logits, sampling), axis=-1).astype(jnp.int32)
