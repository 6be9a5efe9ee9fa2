"""Sharding: the logical-axis rules in process, and sharded == unsharded on 8 simulated CPU devices
in a subprocess (the device count must be set before JAX starts; xdist workers have started it)."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, PartitionSpec as P

from ddtree_jax import sharding
from ddtree_jax.bench import parity
from tests import ROOT



def _abstract(shape):
    return AbstractMesh(tuple(shape), sharding.AXES)


def test_spec_follows_rules_and_divisibility():
    m = _abstract((2, 2, 4))
    assert sharding.spec(("experts", None, None), (16, 8, 8), m) == P(("expert", "tensor"), None, None)
    assert sharding.spec(("experts", None, None), (6, 8, 8), m) == P("expert", None, None)  # 6 % 8
    assert sharding.spec(("experts",), (3,), m) == P(None)
    assert sharding.spec(("streams", None, "vocab"), (4, 3, 512), m) == P("data", None, "tensor")
    assert sharding.spec(("streams", "heads"), (3, 2), m) == P(None, None)
    assert sharding.spec(("vocab", None), (512, 64), _abstract((8, 1, 1))) == P(None, None)
    with pytest.raises(ValueError, match="do not match"):
        sharding.spec(("vocab",), (4, 4), m)


@pytest.mark.parametrize("path, axes", [
    ("embed_tokens/embedding", ("vocab", None)),
    ("lm_head/kernel", (None, "vocab")),
    ("layers_3/mlp/experts/down_qscale", ("experts", None, None)),
    ("layers_3/self_attn/q_b_proj/kernel", (None, "heads")),
    ("layers_3/self_attn/kv_b_proj/kernel", (None, "heads")),
    ("layers_3/self_attn/o_proj/kernel", ("heads", None)),
    ("layers_0/mlp/gate_proj/kernel", (None, "mlp")),
    ("layers_3/mlp/shared_experts/down_proj/kernel", ("mlp", None)),
    ("layers_0/self_attn/k_proj/kernel", (None, "kv_heads")),           # drafter
    ("layers_3/self_attn/q_a_proj/kernel", (None, None)),
    ("layers_3/mlp/gate/kernel", (None, None)),                         # router
    ("layers_3/mlp/gate/e_score_correction_bias", (None,)),
    ("fc/kernel", (None, None)),
])
def test_param_rules(path, axes):
    assert sharding.param_logical_axes(path, len(axes)) == axes


def test_mesh_config_and_make_mesh_errors():
    assert sharding.MeshConfig.parse("2,4,1").shape == (2, 4, 1)
    with pytest.raises(ValueError, match="three positive"):
        sharding.MeshConfig.parse("2,4")
    with pytest.raises(ValueError, match="needs 3 devices"):
        sharding.make_mesh((1, 3, 1), devices=jax.devices()[:1])


def _run_checks(*meshes):
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0 "
                         "--xla_llvm_disable_expensive_passes=true")
    proc = subprocess.run([sys.executable, "-m", "tests.sharding_checks", *meshes], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    for m in meshes:
        shape = tuple(int(x) for x in m.split(":")[0].split(","))
        checks = ("params", "target", "drafter", "tree", "moe_ep") + (("generate", "serve") if "generate" in m else ())
        for check in checks:
            assert f"ok {check} {shape}" in proc.stdout, proc.stdout


def test_sharded_equals_unsharded():
    """Expert + tensor parallel with a full DDTree generate, pure expert parallel, pure data parallel."""
    _run_checks("1,2,4:generate", "1,8,1", "8,1,1")


@pytest.mark.slow
def test_sharded_generate_data_expert():
    _run_checks("2,4,1:generate")


def test_sharded_results_are_checked_at_their_dtypes_tolerance():
    """sharding_bench and k2_step_bench check n-way logits against the 1-way run's with this."""
    want = np.random.default_rng(0).normal(size=(2, 5, 64)).astype(np.float32)
    assert parity.check_sharded("x", want * 1.01, want, "bfloat16") == pytest.approx(1e-2)
    with pytest.raises(AssertionError, match="2-way logits: relative error 0.01 .* exceeds 0.001"):
        parity.check_sharded("2-way logits", want * 1.01, want, jnp.float32)
