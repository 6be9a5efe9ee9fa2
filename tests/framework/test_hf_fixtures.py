"""Checkpoints written by transformers itself (tests/fixtures/make_hf_fixtures.py rebuilds them):
load_target reads them, in both RoPE spellings and with compressed-tensors INT4 experts, to the
logits transformers computes, and the taps are transformers' hidden_states (float32, relative
error <= 1e-4)."""

import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

from ddtree_jax.bench.parity import relative_error
from ddtree_jax.checkpoint import load_target
from ddtree_jax.config import RopeScaling
from ddtree_jax.model import forward, init_cache, target_logits
from tests import ROOT

FIXTURES = os.path.join(ROOT, "tests", "fixtures")
FLOAT = os.path.join(FIXTURES, "hf_deepseek_v3")
YARN = RopeScaling(factor=4.0, original_max_position_embeddings=16, beta_fast=32.0, beta_slow=1.0,
                   mscale=0.8, mscale_all_dim=1.0)


def _with_config(tmp_path, config_file: str) -> str:
    """The float32 fixture with `config_file` as its config.json (a copy)."""
    d = tmp_path / "ckpt"
    shutil.copytree(FLOAT, d)
    shutil.copy(os.path.join(FLOAT, config_file), d / "config.json")
    return str(d)


@pytest.mark.parametrize("which", ["rope_parameters", "rope_scaling", "int4"])
def test_transformers_checkpoint_gives_transformers_logits(tmp_path, which):
    path = {"rope_parameters": lambda: FLOAT,
            "rope_scaling": lambda: _with_config(tmp_path, "config_rope_scaling.json"),
            "int4": lambda: os.path.join(FIXTURES, "hf_deepseek_v3_int4")}[which]()
    ref = np.load(os.path.join(FIXTURES, "hf_logits.npz"))
    cfg, params = load_target(path, dtype=jnp.float32)
    assert (cfg.rope_theta, cfg.rope_scaling) == (10000.0, YARN)
    assert (cfg.n_group, cfg.topk_group, cfg.first_k_dense_replace) == (2, 1, 1)
    assert cfg.quant.format == ("int4" if which == "int4" else "bf16")
    logits = target_logits(params, cfg, ref["tokens"], attn_impl="xla", moe_impl="xla")
    err = relative_error(logits, ref["int4" if which == "int4" else "float32"])
    assert err <= 1e-4, f"{which}: relative logit error {err:.3g} against transformers"


def test_taps_are_transformers_hidden_states():
    """Tap i is hidden_states[i + 1] for every layer, the last one's after the final norm."""
    ref = np.load(os.path.join(FIXTURES, "hf_logits.npz"))
    cfg, params = load_target(FLOAT, dtype=jnp.float32)
    tokens = ref["tokens"]
    s, t = tokens.shape
    layers = tuple(range(cfg.num_hidden_layers))
    out = forward(params, cfg, tokens, np.broadcast_to(np.arange(t), (s, t)), init_cache(cfg, s, t),
                  taps=layers[::-1], attn_impl="xla", moe_impl="xla")
    d = cfg.hidden_size
    for k, i in enumerate(layers[::-1]):
        err = relative_error(out.taps[..., k * d:(k + 1) * d], ref["hidden_states"][i + 1])
        assert err <= 1e-4, f"tap {i}: relative error {err:.3g} against transformers' hidden_states[{i + 1}]"
