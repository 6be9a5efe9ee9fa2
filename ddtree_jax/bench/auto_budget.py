"""The cost model's inputs measured on a run (the sweep's "ddtree-auto" and "ddtree-shared-auto"
points; the model itself is `ddtree_jax.budget`): step-time curves over per-stream budgets or
shared totals, and the drafts' expected acceptance over the first steps of a run."""

from __future__ import annotations

import time
from typing import Sequence

import jax
import numpy as np

from ddtree_jax import engine
from ddtree_jax.budget import BudgetChoice, StepTimeCurve, best_budget, expected_acceptance


def _state(target, drafter, prompts, budget, temperature, max_new_tokens, seed, shared_budget=None):
    su = engine.setup(target, drafter, prompts, method="ddtree", budget=budget,
                      shared_budget=shared_budget, max_new_tokens=max_new_tokens,
                      temperature=temperature)
    return su, engine.prefill(target, drafter, su, seed)


def measure_step_times(target, drafter, prompts: Sequence[Sequence[int]], budgets: Sequence[int], *,
                       shared_cap: int | None = None, temperature: float = 0.0,
                       max_new_tokens: int = 32, reps: int = 3, seed: int = 0,
                       steps_per_call: int = 1) -> StepTimeCurve:
    """Seconds per jitted ddtree step at each budget (shared_cap None), or at each shared total
    of `budgets` with per-stream cap `shared_cap`, as the engine's loop runs it: `reps` calls of
    `steps_per_call` steps dispatched back to back (after a warm-up call), per step."""
    times = []
    for b in budgets:
        su, state = _state(target, drafter, prompts, int(b) if shared_cap is None else shared_cap,
                           temperature, max_new_tokens, seed,
                           None if shared_cap is None else int(b))
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
        engine.stage_draft(target[1], drafter[1], st, su.plan), ~st.done, su.plan).scores)
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
