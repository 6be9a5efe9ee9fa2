"""Greedy DDTree emits ar's tokens on the GPU with the kernels "auto" picks, at every tree budget.

The shipped pair in bfloat16 and float32, budgets 1..64 and a sample above, 1, 2 or 4 streams of
held-out prompts per budget; each case against ar on the same prompts and stream count, judged as
`parity.check_greedy` judges (equal, or apart only at a near-tie of the float32 target). Matmuls at
JAX's default precision, as a user's run has them (the suite's conftest sets "highest"). GPU only:
the CPU runs the xla path, which tests/framework/test_engine.py covers.
"""

import functools
import os

import jax
import jax.numpy as jnp
import pytest

import ddtree_jax as dj
from ddtree_jax.bench import parity
from ddtree_jax.training import data
from tests import ROOT

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")]

PAIR = os.path.join(ROOT, "assets", "pair")
BUDGETS = list(range(1, 65)) + [80, 96, 127, 128, 192, 255, 256]
NEW_TOKENS = 64


@functools.cache
def _pair(dtype: str):
    return (dj.load_target(os.path.join(PAIR, "target"), dtype=jnp.dtype(dtype)),
            dj.load_drafter(os.path.join(PAIR, "drafter"), dtype=jnp.dtype(dtype)))


@functools.cache
def _prompts():
    return data.load_prompts(os.path.join(PAIR, "heldout_prompts.json"))


def _case(budget: int):
    """(prompt indices) for a budget: 1, 2 or 4 streams, a different sample of prompts each time."""
    streams = (1, 2, 4)[budget % 3]
    n = len(_prompts())
    return tuple((7 * budget + 3 * i) % n for i in range(streams))


@functools.cache
def _ar(dtype: str, which: tuple[int, ...]):
    target, _ = _pair(dtype)
    with jax.default_matmul_precision("default"):
        return dj.generate(target, None, [_prompts()[i] for i in which], method="ar",
                           max_new_tokens=NEW_TOKENS, stage_reps=0, warmup=False).tokens


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("budget", BUDGETS)
def test_greedy_ddtree_emits_ars_tokens(budget, dtype):
    target, drafter = _pair(dtype)
    which = _case(budget)
    prompts = [_prompts()[i] for i in which]
    with jax.default_matmul_precision("default"):
        got = dj.generate(target, drafter, prompts, method="ddtree", budget=budget,
                          max_new_tokens=NEW_TOKENS, stage_reps=0, warmup=False).tokens
    parity.check_greedy(target, prompts, _ar(dtype, which), got,
                        f"ddtree@{budget} {dtype} prompts {which}")
