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
