"""Options as values: Kernels, Decoding and Sampling, their keyword aliases, and bad input."""

import dataclasses

import pytest

import ddtree_jax as dj
from ddtree_jax import engine


def test_aliases_set_one_field_each_and_the_rest_keep_their_value():
    sampling, kernels, decoding = engine.resolve_options(
        dj.Sampling(top_k=5), dj.Kernels(moe="xla"), None, temperature=0.5, attn_impl="xla",
        attn_balance=False, steps_per_call=4, max_lag=2)
    assert sampling == dj.Sampling(0.5, 5, 1.0)
    assert kernels == dj.Kernels(attn="xla", moe="xla", attn_balance=False)
    assert decoding == dj.Decoding(steps_per_call=4, max_lag=2) and decoding.lag == 2
    assert dj.Decoding(steps_per_call=2).lag == 1 and dj.Decoding().lag == 3
    assert engine.resolve_options() == (dj.Sampling(), dj.Kernels(), dj.Decoding())


def test_options_are_hashable_static_values():
    for value in (dj.Kernels(), dj.Decoding(), dj.Sampling()):
        hash(value)
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, dataclasses.fields(value)[0].name, None)


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(attn_impl="cuda"), ValueError, "Kernels.attn (attn_impl)"),
    (dict(drafter_attn_impl="nope"), ValueError, "drafter_attn_impl"),
    (dict(attn_balance=1), ValueError, "attn_balance must be a bool"),
    (dict(steps_per_call=0), ValueError, "steps_per_call"),
    (dict(decode_loop="gpu"), ValueError, "decode_loop must be one of"),
    (dict(timing_reps=0), ValueError, "timing_reps"),
    (dict(max_lag=0), ValueError, "max_lag"),
    (dict(temperature=-1.0), ValueError, "temperature"),
    (dict(top_p=0.0), ValueError, "top_p"),
    (dict(atn_impl="xla"), TypeError, "unknown option 'atn_impl'"),
    (dict(kernels="xla"), TypeError, "kernels must be a Kernels"),
    (dict(decoding=4), TypeError, "decoding must be a Decoding"),
])
def test_bad_options_name_the_field(kwargs, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        engine.resolve_options(**kwargs)


def test_generate_takes_values_and_aliases_alike():
    cfg = dj.ModelConfig.preset("tiny")
    import jax
    target = (cfg, dj.init_target(cfg, jax.random.key(0)))
    dcfg = dj.DrafterConfig.for_target(cfg, block_size=4)
    drafter = (dcfg, dj.init_drafter(dcfg, jax.random.key(1)))
    prompts = [[1, 2, 3], [4, 5]]
    a = dj.generate(target, drafter, prompts, budget=4, max_new_tokens=6,
                    kernels=dj.Kernels(attn="xla"), decoding=dj.Decoding(stage_reps=0, warmup=False))
    b = dj.generate(target, drafter, prompts, budget=4, max_new_tokens=6, attn_impl="xla",
                    stage_reps=0, warmup=False)
    assert a.tokens == b.tokens and a.stage_times == {} and b.stage_times == {}
    with pytest.raises(TypeError, match="unknown option 'stage_rep'"):
        dj.generate(target, drafter, prompts, stage_rep=0)
