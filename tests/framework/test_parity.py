"""The greedy judge (`parity.check_greedy`, `parity.tie_reason`) and the routing scores it reads
(`model.routing_choices`): golden parity, and a judge that accepts exactly the tokens a near-tie
of the float32 target explains."""

import itertools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ddtree_jax as dj
from ddtree_jax import model as tgt
from ddtree_jax.bench import parity
from ddtree_jax.reference import model_ref
from ddtree_jax.training import data
from tests import ROOT
from tests.framework.test_model import _params, _tokens

PAIR = os.path.join(ROOT, "assets", "pair")


def test_routing_choices_match_golden():
    """Every MoE layer's selection scores (group-limited routing: the tiny preset has 4 groups)."""
    cfg = dj.ModelConfig.preset("tiny")
    jparams, params, experts = _params(cfg, seed=3)
    tokens = _tokens(cfg, (2, 9), seed=4)
    want = {}
    model_ref.decoder_forward(params, cfg, tokens, experts_hf=experts, choices=want)
    got = tgt.routing_choices(jparams, cfg, tokens)
    assert sorted(got) == sorted(want) == [i for i in range(cfg.num_hidden_layers) if cfg.is_moe_layer(i)]
    for layer, w in want.items():
        g = np.asarray(got[layer], np.float64)
        np.testing.assert_array_equal(np.isinf(g), np.isinf(w), err_msg=f"layer {layer} kept groups")
        finite = np.isfinite(w)
        np.testing.assert_allclose(g[finite], w[finite], rtol=0, atol=1e-5, err_msg=f"layer {layer}")


@pytest.fixture(scope="module")
def case():
    """The shipped pair's target in float32, a held-out prefix and an MoE layer whose last-token
    expert choice, re-resolved, changes the greedy token; -> (target, prefix, layer, the k-th and
    (k+1)-th experts, the gap between their scores)."""
    cfg, params = dj.load_target(os.path.join(PAIR, "target"), dtype=jnp.float32)
    k = cfg.num_experts_per_tok
    prompts = data.load_prompts(os.path.join(PAIR, "heldout_prompts.json"))[:3]
    for prompt, length in itertools.product(prompts, range(16, 64, 3)):
        prefix = prompt[:length]
        base = parity._last_logits(params, cfg, prefix)
        for layer, c in tgt.routing_choices(params, cfg, parity._padded(prefix)).items():
            last = np.asarray(c[0, length - 1], np.float64)
            order = np.argsort(-last)
            gap = last[order[k - 1]] - last[order[k]]
            bias = params[f"layers_{layer}"]["mlp"]["gate"]["e_score_correction_bias"]
            swapped = parity._with_bias(params, layer, bias.at[order[k]].add(gap + 1e-3))
            a, b = base.argmax(), parity._last_logits(swapped, cfg, prefix).argmax()
            if (gap > 2 * parity.ROUTE_TIE and a != b
                    and base[a] - base[b] > 2 * parity.TIE_REL * np.abs(base).max()):
                return (cfg, params), prefix, layer, order[k - 1], order[k], gap
    raise AssertionError("no prefix of the first held-out prompts has an expert choice that moves "
                         "the greedy token")


def _tied(case, gap: float):
    """The case's target with the layer's two experts `gap` apart in score (bias moved)."""
    (cfg, params), prefix, layer, kth, next_, old_gap = case
    bias = params[f"layers_{layer}"]["mlp"]["gate"]["e_score_correction_bias"]
    return cfg, parity._with_bias(params, layer, bias.at[next_].add(old_gap - gap))


def test_a_routing_near_tie_explains_exactly_the_token_it_moves_to(case):
    prefix, layer = case[1], case[2]
    tied = _tied(case, 1e-4)
    row = parity._last_logits(tied[1], tied[0], prefix)
    expected = int(row.argmax())
    flipped = _tied(case, -1e-4)
    moved_to = int(parity._last_logits(flipped[1], flipped[0], prefix).argmax())
    assert moved_to != expected
    assert parity.tie_reason(tied, prefix, expected, moved_to) == f"routing at layer {layer}"
    assert parity.check_greedy(tied, [prefix], [[expected]], [[moved_to]], "tied") == 1
    # a token the re-resolved target does not emit is not explained
    far = int(np.argsort(row)[len(row) // 2])
    assert parity.tie_reason(tied, prefix, expected, far) is None
    with pytest.raises(AssertionError, match=rf"tied: stream 0 emits token {far} at position 0 "
                                             rf"where ar emits {expected}.*not lossless"):
        parity.check_greedy(tied, [prefix], [[expected]], [[far]], "tied")
    # the same two tokens with the experts far apart in score: no near-tie, not lossless
    apart = _tied(case, 2 * parity.ROUTE_TIE)
    assert parity._last_logits(apart[1], apart[0], prefix).argmax() == expected
    assert parity.tie_reason(apart, prefix, expected, moved_to) is None


def test_routing_tie_layers_names_the_tied_layer_only(case):
    prefix, layer = case[1], case[2]
    assert layer in parity.routing_tie_layers(_tied(case, 1e-4), prefix)
    assert layer not in parity.routing_tie_layers(_tied(case, 2 * parity.ROUTE_TIE), prefix)


def test_a_logit_near_tie_is_still_one(case):
    """The lm_head column of the runner-up made 0.1% shorter than the argmax's: a logit near-tie."""
    (cfg, params), prefix = case[0], case[1]
    row = parity._last_logits(params, cfg, prefix)
    first, second = (int(i) for i in np.argsort(-row)[:2])
    head = params["lm_head"]["kernel"]
    tied = cfg, {**params, "lm_head": {"kernel": head.at[:, second].set(head[:, first] * 0.999)}}
    assert parity.tie_reason(tied, prefix, first, second) == "logits"
    assert parity.check_greedy(tied, [prefix], [[first]], [[second]], "tied") == 1
    assert parity.check_greedy(tied, [prefix], [[first, 5]], [[first, 5]], "equal") == 0


@pytest.mark.parametrize("tokens, d, experts", [(56, 256, 8), (1024, 7168, 384)])
def test_router_logits_are_full_float32_at_default_precision(tokens, d, experts):
    """The expert choice reads these logits: at JAX's default matmul precision a GPU multiplies
    float32 as TF32 (relative error ~1e-3, enough to flip a near-tie); the router asks for full
    float32. Shapes: the shipped pair's verify at budget 55, and Kimi-K2's router at 1,024 tokens."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((tokens, d)).astype(np.float32)
    kernel = (rng.standard_normal((d, experts)) / np.sqrt(d)).astype(np.float32)
    with jax.default_matmul_precision("default"):
        got = np.asarray(tgt.router_logits(jnp.asarray(x, jnp.bfloat16), jnp.asarray(kernel)), np.float64)
    want = np.asarray(jnp.asarray(x, jnp.bfloat16), np.float64) @ kernel.astype(np.float64)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
