"""Shared by the sweep's tests: a sweep config loaded from configs/, and the overrides that make a
sweep run in seconds on the random tiny pair."""

import importlib.util
import os

from ddtree_jax.bench.sweep import load_config  # noqa: F401  (configs/<name>.py's get_config())
from tests import ROOT


def load_module(name):
    """The module configs/<name>.py."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "configs", name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def overrides(out, cache, **kw):
    """Config fields for a sweep of seconds: the random tiny pair, ar and ddtree at budget 2, one
    stream, 3 new tokens, one timed decode; kw replaces any of them."""
    c = dict(random_tiny=True, random_vocab=16, block_size=3, prompt_len=5, methods=("ar", "ddtree"),
             budgets=(2,), streams=(1,), max_new_tokens=3, stage_reps=0, auto_steps=1, timing_reps=1,
             out_dir=str(out), compile_cache=str(cache))
    c.update(kw)
    return c
