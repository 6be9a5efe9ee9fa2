"""Arguments beyond what the engine computes in are refused by name, never wrapped or dropped."""

import jax
import pytest

import ddtree_jax as dj


@pytest.fixture(scope="module")
def target():
    cfg = dj.ModelConfig.preset("tiny")
    return cfg, dj.init_target(cfg, jax.random.key(0))


@pytest.mark.parametrize("prompts, kwargs, words", [
    ([[2**32 + 5, 3]], {}, r"prompts\[0\] must lie in int32's range"),
    ([[1, 2], [2**70]], {}, r"prompts\[1\] must lie in int32's range"),
    ([[1, 2]], dict(max_new_tokens=2**32 + 2), "max_new_tokens must lie in int32's range"),
    ([[1, 2]], dict(max_new_tokens=[4, 2**31]), "max_new_tokens must lie in int32's range"),
    ([[1, 2]], dict(stop_tokens=(2**40,)), "stop_tokens must lie in int32's range"),
    ([[1, 2]], dict(stop_tokens=(512,)), r"stop_tokens must lie in the vocabulary \[0, 512\); got \[512\]"),
    ([[1, 2]], dict(stop_tokens=(-1, 3)), r"stop_tokens must lie in the vocabulary .* got \[-1\]"),
    ([[1, 2.5]], {}, r"prompts\[0\] must hold integers"),
])
def test_generate_refuses_values_it_would_wrap(target, prompts, kwargs, words):
    with pytest.raises(ValueError, match=words):
        dj.generate(target, None, prompts, method="ar", **kwargs)


def test_a_forward_refuses_token_ids_beyond_int32(target):
    cfg, params = target
    with pytest.raises(ValueError, match="tokens must lie in int32's range"):
        dj.target_logits(params, cfg, [[1, 2**33]])


@pytest.fixture(scope="module")
def drafter(target):
    dcfg = dj.DrafterConfig.for_target(target[0], block_size=4)
    return dcfg, dj.init_drafter(dcfg, jax.random.key(1))


@pytest.mark.parametrize("which, kwargs, words", [
    ("target_params", {}, r"target must be a \(ModelConfig, params\) pair, as load_target returns; got dict"),
    ("drafter_short", {}, r"drafter must be a \(DrafterConfig, params\) pair, .* got a tuple of 1"),
    ("swapped", {}, r"target must be a \(ModelConfig, params\) pair"),
    ("ok", dict(attn_impl="triton"), r"attn_impl='triton': kernel operation 'mla_attention' has no implementation"),
    ("ok", dict(moe_impl="mosaic_gpu"), r"moe_impl='mosaic_gpu': kernel operation 'moe_experts'"),
    ("ok", dict(topk_impl="triton"), r"topk_impl='triton': kernel operation 'topk_logsumexp'"),
    ("ok", dict(drafter_attn_impl="mosaic_gpu"), r"drafter_attn_impl='mosaic_gpu'"),
])
def test_generate_names_a_bad_pair_or_kernel_argument(target, drafter, which, kwargs, words):
    t, d = {"target_params": (target[1], drafter), "drafter_short": (target, drafter[:1]),
            "swapped": (drafter, target), "ok": (target, drafter)}[which]
    with pytest.raises(ValueError, match=words):
        dj.generate(t, d, [[1, 2]], max_new_tokens=2, stage_reps=0, **kwargs)
