"""Cost-aware tree budget: the budget that maximises expected accepted tokens per second.

Expectation. Let the drafter give per-depth distributions q_1..q_L and assume they are calibrated:
the target's token at depth d, given that depths < d were accepted, is distributed as q_d. A tree
node whose path carries tokens (x_1..x_d) is then accepted with probability prod_k q_k(x_k) =
exp(score), its `Tree.scores` entry. A step emits the accepted nodes plus one bonus token, so

    E[acceptance length | budget b] = 1 + sum over the first b nodes of exp(score).

Trees are best-first, so the tree of budget b is the first b nodes of any larger one: one tree at
the largest budget gives every smaller budget by a cumulative sum. A miscalibrated (overconfident)
drafter makes this an overestimate; the choice only needs its shape over b to be right.

Cost. t(b) = the measured step time, linear between measured budgets and constant outside them;
candidates stop at the largest measured budget. Rate(b) = E(b) / t(b), expected accepted tokens
per second per stream (t(b) is measured at the run's stream count, so the streams' total rate is
this times a factor independent of b); the choice is its argmax (`best_budget`, once per run).

Shared budget (`ddtree_jax.tree.share_budget`). With one budget N over all streams, a step
verifies the N best nodes of the union of the streams' trees (the ranked union, scores
descending), and its expected emitted tokens over its A active streams are

    E(N) = A + sum over the first N nodes of the ranked union of exp(score).

With t(N) the step time measured at shared budget N (same streams and per-stream cap), the step's
rate is E(N) / t(N). Adding node N + 1 pays when its expected tokens per second of extra time,
exp(score_{N+1}) / (t(N+1) - t(N)), beat the step's E(N) / t(N): exactly when the rate rises.
`shared_total` takes the N in 0..min(real nodes, largest measured N) of the highest rate (the
first on ties), on the device, per step; its float64 golden is
`ddtree_jax.reference.tree_ref.shared_total_reference`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np


def expected_acceptance(scores) -> np.ndarray:
    """scores [..., B] path log-probs (padding -inf) -> [..., B]: E[acceptance length] for budgets 1..B."""
    return 1.0 + np.cumsum(np.exp(np.asarray(scores, np.float64)), axis=-1)


@dataclasses.dataclass(frozen=True)
class StepTimeCurve:
    """Measured seconds per step at a few budgets (or shared totals); piecewise linear in between."""

    budgets: tuple[int, ...]
    seconds: tuple[float, ...]

    def __post_init__(self):
        if len(self.budgets) < 1 or len(self.budgets) != len(self.seconds):
            raise ValueError("StepTimeCurve needs >= 1 (budget, seconds) pair, equally many of each")
        order = np.argsort(self.budgets)
        object.__setattr__(self, "budgets", tuple(int(self.budgets[i]) for i in order))
        object.__setattr__(self, "seconds", tuple(float(self.seconds[i]) for i in order))
        if len(set(self.budgets)) != len(self.budgets) or min(self.seconds) <= 0:
            raise ValueError(f"budgets must be distinct and seconds > 0: {self}")

    def __call__(self, budget) -> np.ndarray:
        return np.interp(budget, self.budgets, self.seconds)


@dataclasses.dataclass(frozen=True)
class BudgetChoice:
    budget: int
    expected_tau: float          # E[acceptance length] at `budget`
    step_seconds: float          # t(budget)
    rate: float                  # expected accepted tokens per second per stream


def best_budget(expected: np.ndarray, curve: StepTimeCurve) -> BudgetChoice:
    """expected [B] (E for budgets 1..B) -> the budget in 1..min(B, max measured) with the best E/t."""
    expected = np.asarray(expected, np.float64)
    b = np.arange(1, min(expected.shape[0], curve.budgets[-1]) + 1)
    rate = expected[b - 1] / curve(b)
    i = int(np.argmax(rate))
    return BudgetChoice(int(b[i]), float(expected[i]), float(curve(b[i])), float(rate[i]))


def shared_total(scores: jax.Array, num_nodes: jax.Array, active: jax.Array,
                 curve: StepTimeCurve) -> jax.Array:
    """The shared budget N of the best expected rate E(N) / t(N) (module docstring); jit-able.

    scores [S, B] float32 path log-probs of per-stream trees in node order (`Tree.scores`),
    num_nodes [S] their real nodes, active [S] bool (inactive streams add neither nodes nor A);
    curve: t(N) over shared totals. -> int32 []: N in 0..min(real nodes of the active streams,
    curve.budgets[-1]), the smallest on ties.
    """
    s, b = scores.shape
    real = active[:, None] & (jnp.arange(b)[None, :] < num_nodes[:, None])
    p = jnp.sort(jnp.where(real, jnp.exp(scores.astype(jnp.float32)), 0.0).reshape(-1))[::-1]
    n = jnp.arange(s * b + 1)
    expected = (jnp.sum(active, dtype=jnp.float32)
                + jnp.concatenate([jnp.zeros((1,), jnp.float32), jnp.cumsum(p)]))
    seconds = jnp.interp(n.astype(jnp.float32), jnp.asarray(curve.budgets, jnp.float32),
                         jnp.asarray(curve.seconds, jnp.float32))
    ok = (n <= jnp.sum(real)) & (n <= curve.budgets[-1])
    return jnp.argmax(jnp.where(ok, expected / seconds, -jnp.inf)).astype(jnp.int32)
