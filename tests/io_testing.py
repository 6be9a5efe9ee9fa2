"""Shared helpers of the checkpoint tests: random target params, exact comparison, and a writer
run in a subprocess that is killed (SIGKILL) at a chosen point of its write."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np

from tests import ROOT

# Runs before the writer's code in the subprocess: stall(target, nth, marker, truncate) replaces the
# function `target` ("module.attr") so that its nth call (after running, with its file argument
# `truncate` cut to half its size: a write torn midway) creates `marker` and sleeps until killed.
_STALL = '''
import importlib, os, sys, time
sys.path.insert(0, {root!r})

def stall(target, nth, marker, truncate=None):
    mod_name, attr = target.rsplit(".", 1)
    mod = importlib.import_module(mod_name)
    real, calls = getattr(mod, attr), [0]

    def wrapper(*args, **kwargs):
        calls[0] += 1
        if calls[0] != nth:
            return real(*args, **kwargs)
        if truncate is not None:
            real(*args, **kwargs)
            f = args[truncate]
            if hasattr(f, "fileno"):
                f.flush()
                os.ftruncate(f.fileno(), os.fstat(f.fileno()).st_size // 2)
            else:
                os.truncate(f, os.path.getsize(f) // 2)
        open(marker, "w").close()
        time.sleep(600)

    setattr(mod, attr, wrapper)
'''


def run_killed(code: str, marker, stall: tuple | None = None, after_s: float = 0.0,
               timeout_s: float = 60.0) -> None:
    """Run `code` in a fresh python (repository on sys.path; `stall`: (target, nth[, truncate])
    arguments of the stall above) and SIGKILL it `after_s` seconds after `marker` appears
    (the stalled call, or the code itself, creates it). AssertionError when the writer exits or
    the marker does not come within timeout_s."""
    marker = os.fspath(marker)
    prelude = _STALL.format(root=ROOT)
    if stall is not None:
        prelude += f"stall(*{tuple(stall[:2])!r}, {marker!r}, *{tuple(stall[2:])!r})\n"
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.Popen([sys.executable, "-c", prelude + code], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout_s
    try:
        while not os.path.exists(marker):
            if proc.poll() is not None:
                raise AssertionError(f"the writer exited ({proc.returncode}) before its kill point:\n"
                                     + proc.stderr.read().decode()[-3000:])
            assert time.monotonic() < deadline, f"no {marker} within {timeout_s} s"
            time.sleep(0.02)
        time.sleep(after_s)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stderr.close()


@functools.cache
def _abstract(cfg, dtype):
    from ddtree_jax.model import init_target
    return jax.eval_shape(functools.partial(init_target, cfg, dtype=dtype), jax.random.key(0))


def random_params(cfg, dtype, seed: int = 0):
    """init_target's pytree for `cfg` filled with random values (cheaper than init_target on a
    busy CPU); routed experts in cfg.quant's format."""
    import jax.numpy as jnp
    from pallas_kernels import moe
    rng = np.random.default_rng(seed)
    params = jax.tree.map(lambda s: jnp.asarray((rng.standard_normal(s.shape) * 0.05).astype(s.dtype)),
                          _abstract(cfg, dtype))
    e, d, i = cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size
    for layer in range(cfg.num_hidden_layers):
        if cfg.is_moe_layer(layer):
            w = [jnp.asarray(rng.standard_normal((e,) + s) * 0.05, jnp.float32)
                 for s in ((i, d), (i, d), (d, i))]
            if cfg.quant.format == "bf16":
                experts = moe.prepare_experts_bf16(*[x.astype(dtype) for x in w])
            else:
                experts = moe.prepare_experts_int4(*[y for x in w for y in moe.quantize_int4(x)])
            params[f"layers_{layer}"]["mlp"]["experts"] = experts
    return params


def like_init(cfg, params, dtype) -> None:
    """Assert that `params` has init_target's tree, shapes and dtypes."""
    want = _abstract(cfg, dtype)
    assert jax.tree.structure(params) == jax.tree.structure(want)
    for x, s in zip(jax.tree.leaves(params), jax.tree.leaves(want)):
        assert (x.shape, x.dtype) == (s.shape, s.dtype)


def assert_identical(a, b) -> None:
    """Same tree, dtypes, shapes and values, bit for bit."""
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
