"""Checkpoints written by transformers itself (tests/fixtures/make_hf_fixtures.py rebuilds them):
load_target reads them, in both RoPE spellings and with compressed-tensors INT4 experts, to the
logits transformers computes, and the taps are transformers' hidden_states (float32, relative
error <= 1e-4)."""

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from ddtree_jax.bench.parity import relative_error
from ddtree_jax.checkpoint import load_target
from ddtree_jax.config import DrafterConfig, RopeScaling
from ddtree_jax.drafter import drafter_hidden, init_drafter
from ddtree_jax.drafter_io import load_drafter, save_drafter
from ddtree_jax.reference.drafter_ref import drafter_hidden_reference
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


def _hf_reader(path: str) -> dict:
    """A z-lab drafter's model.safetensors read by its HF names alone ("layers.0.mlp.up_proj.weight"
    -> params["layers_0"]["mlp"]["up_proj"]["kernel"], [out, in] transposed; 1-D weights -> "scale")."""
    params = {}
    for name, w in load_file(os.path.join(path, "model.safetensors")).items():
        parts = name.removesuffix(".weight").split(".")
        if parts[0] == "layers":
            parts = [f"layers_{parts[1]}", *parts[2:]]
        node = params
        for p in parts:
            node = node.setdefault(p, {})
        node["kernel" if w.ndim == 2 else "scale"] = w.T if w.ndim == 2 else w
    return params


def test_a_drafter_sees_the_same_context_here_and_under_transformers_convention(tmp_path):
    """A z-lab-layout drafter tapping every layer of the transformers-written target, the last one
    included: written by save_drafter, read back and written again unchanged; its block's hidden
    states from the framework's taps equal the float64 golden's from transformers' hidden_states
    [i + 1], the weights read by their HF names (float32, relative error <= 1e-4)."""
    ref = np.load(os.path.join(FIXTURES, "hf_logits.npz"))
    cfg, params = load_target(FLOAT, dtype=jnp.float32)
    layers = tuple(range(cfg.num_hidden_layers))
    dcfg = DrafterConfig.for_target(cfg, target_layer_ids=layers, block_size=4)
    save_drafter(tmp_path / "a", dcfg, init_drafter(dcfg, jax.random.key(3)))
    got_cfg, dparams = load_drafter(tmp_path / "a", dtype=jnp.float32)
    save_drafter(tmp_path / "b", got_cfg, dparams)
    first, again = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert got_cfg == dcfg and first.keys() == again.keys()
    assert all(np.array_equal(first[k], again[k]) for k in first)

    tokens = ref["tokens"]
    s, t = tokens.shape
    n, b = t - dcfg.block_size, dcfg.block_size
    taps = forward(params, cfg, tokens, np.broadcast_to(np.arange(t), (s, t)), init_cache(cfg, s, t),
                   taps=layers, attn_impl="xla", moe_impl="xla").taps
    hf_taps = np.concatenate([ref["hidden_states"][i + 1] for i in layers], axis=-1)
    noise = np.random.default_rng(4).standard_normal((s, b, cfg.hidden_size)).astype(np.float32)
    positions = np.broadcast_to(np.arange(t), (s, t))
    got = drafter_hidden(dparams, dcfg, taps[:, :n], jnp.asarray(noise), jnp.asarray(positions))
    want = drafter_hidden_reference(_hf_reader(str(tmp_path / "a")), dcfg, hf_taps[:, :n], noise, positions)
    err = relative_error(got, want)
    assert err <= 1e-4, f"drafter hidden states: relative error {err:.3g} against the transformers-convention golden"
