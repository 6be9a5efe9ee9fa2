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
this times a factor independent of b); the choice is its argmax.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import jax
import numpy as np

from ddtree_jax import engine


def expected_acceptance(scores) -> np.ndarray:
    """scores [..., B] path log-probs (padding -inf) -> [..., B]: E[acceptance length] for budgets 1..B."""
    return 1.0 + np.cumsum(np.exp(np.asarray(scores, np.float64)), axis=-1)


@dataclasses.dataclass(frozen=True)
class StepTimeCurve:
    """Measured seconds per step at a few budgets; piecewise linear in between."""

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


def _state(target, drafter, prompts, budget, temperature, max_new_tokens, seed):
    su = engine.setup(target, drafter, prompts, method="ddtree", budget=budget,
                      max_new_tokens=max_new_tokens, temperature=temperature)
    return su, engine.prefill(target, drafter, su, seed)


def measure_step_times(target, drafter, prompts: Sequence[Sequence[int]], budgets: Sequence[int], *,
                       temperature: float = 0.0, max_new_tokens: int = 32, reps: int = 3,
                       seed: int = 0, steps_per_call: int = 1) -> StepTimeCurve:
    """Seconds per jitted ddtree step at each budget, as the engine's loop runs it: `reps` calls of
    `steps_per_call` steps dispatched back to back (after a warm-up call), per step."""
    times = []
    for b in budgets:
        su, state = _state(target, drafter, prompts, int(b), temperature, max_new_tokens, seed)
        state, _ = jax.block_until_ready(engine.decode_steps(target[1], drafter[1], state, su.plan,
                                                             steps_per_call))
        t0 = time.perf_counter()
        for _ in range(reps):
            state, _ = engine.decode_steps(target[1], drafter[1], state, su.plan, steps_per_call)
        jax.block_until_ready(state)
        times.append((time.perf_counter() - t0) / (reps * steps_per_call))
    return StepTimeCurve(tuple(int(b) for b in budgets), tuple(times))


def draft_expectation(target, drafter, prompts: Sequence[Sequence[int]], max_budget: int, *,
                      steps: int = 4, temperature: float = 0.0, max_new_tokens: int = 32,
                      seed: int = 0) -> np.ndarray:
    """[max_budget]: E[acceptance length] per budget, averaged over streams and the trees of the
    first `steps` steps of a ddtree run at `max_budget`."""
    su, state = _state(target, drafter, prompts, max_budget, temperature, max_new_tokens, seed)
    tree_of = jax.jit(lambda st: engine.stage_tree(
        engine.stage_draft(target[1], drafter[1], st, su.plan), su.plan).scores)
    curves = []
    for _ in range(min(steps, su.max_steps)):
        active = ~np.asarray(state.done)
        if not active.any():
            break
        curves.append(expected_acceptance(np.asarray(tree_of(state)))[active])
        state, _ = engine.decode_steps(target[1], drafter[1], state, su.plan)
    return np.concatenate(curves).mean(axis=0)


def choose_budget(target, drafter, prompts: Sequence[Sequence[int]], curve: StepTimeCurve, *,
                  steps: int = 4, temperature: float = 0.0, max_new_tokens: int = 32,
                  seed: int = 0) -> BudgetChoice:
    """Pick the budget for a run from its first steps' trees and the step-time curve."""
    expected = draft_expectation(target, drafter, prompts, curve.budgets[-1], steps=steps,
                                 temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)
    return best_budget(expected, curve)
