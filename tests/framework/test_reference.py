"""The numpy goldens (ddtree_jax/reference) against independent facts of the math."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from ddtree_jax.config import ModelConfig, RopeScaling
from ddtree_jax.reference import model_ref as ref
from pallas_kernels.moe import reference as moe_reference

TINY = ModelConfig.preset("tiny")


def _rotate_complex(x, pos, inv_freq):
    """Plain RoPE as complex multiplication of the pairs (x[2i] + i x[2i+1]) by e^{i pos f_i}."""
    z = (x[..., 0::2] + 1j * x[..., 1::2]) * np.exp(1j * pos * inv_freq)
    out = np.empty(x.shape)
    out[..., 0::2], out[..., 1::2] = z.real, z.imag
    return out


# ---- RoPE ------------------------------------------------------------------------------------

@pytest.mark.parametrize("cfg", [TINY, TINY.replace(rope_scaling=None), ModelConfig.preset("kimi_k2_6")],
                         ids=["yarn_tiny", "plain", "yarn_k2"])
def test_rope_position_zero_is_identity_and_rotation_preserves_norm(cfg):
    x = np.random.default_rng(0).standard_normal((5, cfg.qk_rope_head_dim))
    np.testing.assert_allclose(ref.apply_rope(x, np.zeros(5), cfg), x, atol=1e-15)
    y = ref.apply_rope(x, np.array([1, 7, 100, 4095, 100000]), cfg)
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-12)


def test_rope_without_scaling_or_factor_one_is_the_plain_formula():
    r, theta = TINY.qk_rope_head_dim, TINY.rope_theta
    plain_inv = theta ** (-np.arange(r // 2) * 2.0 / r)
    x = np.random.default_rng(1).standard_normal((6, r))
    pos = np.array([0, 1, 2, 31, 200, 511])
    want = _rotate_complex(x, pos[:, None], plain_inv)
    for cfg in (TINY.replace(rope_scaling=None),
                TINY.replace(rope_scaling=RopeScaling(factor=1.0, original_max_position_embeddings=64,
                                                      mscale=1.0, mscale_all_dim=0.0))):
        np.testing.assert_allclose(ref.yarn_inv_freq(cfg), plain_inv, rtol=1e-15)
        np.testing.assert_allclose(ref.apply_rope(x, pos, cfg), want, atol=1e-12)


def test_yarn_inv_freq_correction_range_by_hand():
    # tiny: r=8, theta=5e4, original 64, beta_fast 32 -> dim -0.42 -> low 0; beta_slow 1 -> 0.86 -> high 1:
    # ramp [0, 1, 1, 1], so pair 0 keeps its frequency and pairs 1..3 are divided by the factor 8.
    extra = 50000.0 ** (-np.arange(4) * 2.0 / 8)
    np.testing.assert_allclose(ref.yarn_inv_freq(TINY), extra * [1, 1 / 8, 1 / 8, 1 / 8], rtol=1e-15)
    # K2: r=64, theta=5e4, original 4096, beta 1/1 -> dim 19.17 -> low 19, high 20:
    # pairs 0..19 extrapolate (original), pairs 20..31 interpolate (divided by 64).
    k2 = ModelConfig.preset("kimi_k2_6")
    extra = 50000.0 ** (-np.arange(32) * 2.0 / 64)
    want = np.where(np.arange(32) <= 19, extra, extra / 64)
    np.testing.assert_allclose(ref.yarn_inv_freq(k2), want, rtol=1e-15)


def test_rope_cos_sin_carry_the_mscale_ratio():
    cfg = TINY.replace(rope_scaling=RopeScaling(factor=8.0, original_max_position_embeddings=64,
                                                mscale=2.0, mscale_all_dim=1.0))
    ratio = (0.2 * math.log(8) + 1) / (0.1 * math.log(8) + 1)
    cos, sin = ref.rope_cos_sin(np.array([0, 3]), cfg)
    np.testing.assert_allclose(cos[0], ratio, rtol=1e-15)
    np.testing.assert_allclose(cos ** 2 + sin ** 2, ratio ** 2, rtol=1e-14)


@pytest.mark.parametrize("cfg", [TINY, TINY.replace(rope_scaling=None)], ids=["yarn", "plain"])
def test_rope_scores_depend_only_on_position_difference(cfg):
    rng = np.random.default_rng(2)
    q, k = rng.standard_normal((2, cfg.qk_rope_head_dim))
    def score(m, n):
        return ref.apply_rope(q, m, cfg) @ ref.apply_rope(k, n, cfg)
    for m, n in [(5, 2), (40, 3), (0, 17)]:
        for shift in (1, 13, 300):
            assert score(m + shift, n + shift) == pytest.approx(score(m, n), rel=1e-10, abs=1e-12)
    assert abs(score(5, 2) - score(6, 2)) > 1e-6   # and it does depend on the difference


# ---- INT4 ------------------------------------------------------------------------------------

def test_int4_pack_unpack_round_trip():
    v = np.random.default_rng(3).integers(-8, 8, size=(3, 5, 64))
    packed = moe_reference.pack_int4_reference(v)
    assert packed.dtype == np.int32 and packed.shape == (3, 5, 8)
    np.testing.assert_array_equal(moe_reference.unpack_int4_reference(packed), v)


def test_int4_bit_layout_by_hand():
    # nibble = value + 8, lowest K index in the lowest nibble.
    v = np.array([[-8, -7, -6, -5, -4, -3, -2, -1, 7, 6, 5, 4, 3, 2, 1, 0]])
    packed = moe_reference.pack_int4_reference(v)
    assert packed.view(np.uint32).tolist() == [[0x76543210, 0x89ABCDEF]]
    assert packed.tolist() == [[0x76543210, 0x89ABCDEF - 2 ** 32]]
    with pytest.raises(ValueError, match=r"\[-8, 7\]"):
        moe_reference.pack_int4_reference(np.full((1, 8), 8))


def test_int4_quantize_error_within_half_a_step():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((2, 6, 128)) * rng.uniform(0.01, 3, size=(2, 6, 1))
    w[0, 0, :32] = 0.0                                           # an all-zero group
    packed, scale = moe_reference.quantize_int4_reference(w)
    assert packed.shape == (2, 6, 16) and scale.shape == (2, 6, 4) and scale.dtype == np.float32
    np.testing.assert_array_equal(scale.astype(ml_dtypes.bfloat16).astype(np.float32), scale)
    deq = moe_reference.dequantize_int4_reference(packed, scale)
    step = np.repeat(scale.astype(np.float64), 32, axis=-1)
    assert np.all(np.abs(deq - w) <= step / 2 + 1e-12)
    assert np.all(deq[0, 0, :32] == 0.0)
    # the group maximum maps to +-7 steps (up to the bf16 rounding of the scale)
    q = moe_reference.unpack_int4_reference(packed).reshape(2, 6, 4, 32)
    assert np.all(np.abs(q).max(axis=-1)[scale > 0] == 7)


# ---- router and MoE --------------------------------------------------------------------------

def test_router_hand_made_case():
    cfg = TINY.replace(n_routed_experts=8, n_group=4, topk_group=2, num_experts_per_tok=2,
                       routed_scaling_factor=2.5)
    logits = np.array([2.0, -1.0, 0.5, 0.4, 1.0, 1.0, -2.0, 3.0])
    bias = np.array([0.0, 0.0, 0.0, 0.2, 0.0, 0.0, 0.0, -0.9])
    # sigmoid ~ [.881 .269 .622 .599 .731 .731 .119 .953]; biased groups: g0 1.150, g1 1.421,
    # g2 1.462, g3 0.172 -> keep g2, g1 (expert 0, the best single score, is dropped with g0).
    # Among {2,3,4,5}: b3 = .799 (bias lifts 3 over 2), then b4 = b5 = .731: the tie goes to 4.
    ids, w = ref.router(np.ones((1, 1)), logits[None], bias, cfg)
    assert ids.tolist() == [[3, 4]]
    s = 1 / (1 + np.exp(-np.array([0.4, 1.0])))                  # unbiased weights
    np.testing.assert_allclose(w[0], 2.5 * s / s.sum(), rtol=1e-14)


def test_router_weights_and_groups_on_random_tokens():
    rng = np.random.default_rng(5)
    cfg = TINY
    x = rng.standard_normal((20, cfg.hidden_size))
    kernel = rng.standard_normal((cfg.hidden_size, cfg.n_routed_experts)) / 8
    bias = 0.3 * rng.standard_normal(cfg.n_routed_experts)
    ids, w = ref.router(x, kernel, bias, cfg)
    assert ids.shape == w.shape == (20, cfg.num_experts_per_tok)
    np.testing.assert_allclose(w.sum(-1), cfg.routed_scaling_factor, rtol=1e-12)
    per = cfg.n_routed_experts // cfg.n_group
    b = 1 / (1 + np.exp(-(x @ kernel))) + bias
    gscore = np.sort(b.reshape(20, cfg.n_group, per), axis=-1)[..., -2:].sum(-1)
    for t in range(20):
        kept = set(np.argsort(-gscore[t])[:cfg.topk_group].tolist())
        assert set((ids[t] // per).tolist()) <= kept
        assert len(set(ids[t].tolist())) == cfg.num_experts_per_tok
    unnorm = cfg.replace(norm_topk_prob=False, routed_scaling_factor=1.0)
    ids2, w2 = ref.router(x, kernel, bias, unnorm)
    np.testing.assert_array_equal(ids2, ids)
    np.testing.assert_allclose(w2, np.take_along_axis(1 / (1 + np.exp(-(x @ kernel))), ids, 1))


def test_moe_with_identical_experts_is_scaling_times_one_expert_plus_shared():
    rng = np.random.default_rng(6)
    cfg = TINY
    params, experts = ref.random_params(cfg, rng)
    mlp, ex = params["layers_1"]["mlp"], experts[1]
    same = {n: np.broadcast_to(a[:1], a.shape) for n, a in ex.items()}
    x = rng.standard_normal((5, cfg.hidden_size))
    one = ref.swiglu_mlp(x, ex["gate"][0].T, ex["up"][0].T, ex["down"][0].T)
    sh = mlp["shared_experts"]
    shared = ref.swiglu_mlp(x, sh["gate_proj"]["kernel"], sh["up_proj"]["kernel"], sh["down_proj"]["kernel"])
    np.testing.assert_allclose(ref.moe_layer(x, mlp, cfg, same), cfg.routed_scaling_factor * one + shared,
                               rtol=1e-10, atol=1e-12)


# ---- MLA attention ---------------------------------------------------------------------------

def test_mla_empty_cache_causal_matches_per_token_computation():
    rng = np.random.default_rng(7)
    cfg = TINY
    params, _ = ref.random_params(cfg, rng, experts_hf=False)
    p = {m: {k: np.asarray(v, np.float64) for k, v in sub.items()}
         for m, sub in params["layers_0"]["self_attn"].items()}
    T = 4
    H, nope, r, vd, kvl = (cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim,
                           cfg.v_head_dim, cfg.kv_lora_rank)
    x = rng.standard_normal((T, cfg.hidden_size))
    pos = np.array([3, 4, 5, 6])
    inv = ref.yarn_inv_freq(cfg)

    def norm(v, g):
        return g * v / math.sqrt(np.mean(v * v) + cfg.rms_norm_eps)

    def rot(v, m):
        return _rotate_complex(v, m, inv)

    lat, out = [], []
    for i in range(T):
        a = x[i] @ p["kv_a_proj_with_mqa"]["kernel"]
        lat.append(np.concatenate([norm(a[:kvl], p["kv_a_layernorm"]["scale"]), rot(a[kvl:], pos[i])]))
        q = norm(x[i] @ p["q_a_proj"]["kernel"], p["q_a_layernorm"]["scale"]) @ p["q_b_proj"]["kernel"]
        heads = []
        for h in range(H):
            qh = q[h * (nope + r):(h + 1) * (nope + r)]
            wk = p["kv_b_proj"]["kernel"][:, h * (nope + vd):h * (nope + vd) + nope]
            wv = p["kv_b_proj"]["kernel"][:, h * (nope + vd) + nope:(h + 1) * (nope + vd)]
            sc = np.array([(qh[:nope] @ (lat[j][:kvl] @ wk) + rot(qh[nope:], pos[i]) @ lat[j][kvl:])
                           * cfg.softmax_scale for j in range(i + 1)])
            pr = np.exp(sc - sc.max())
            pr /= pr.sum()
            heads.append(sum(pr[j] * (lat[j][:kvl] @ wv) for j in range(i + 1)))
        out.append(np.concatenate(heads) @ p["o_proj"]["kernel"])

    got, got_lat = ref.mla_attention(x[None], params["layers_0"]["self_attn"], pos[None], None,
                                     np.zeros(1), None, cfg)
    np.testing.assert_allclose(got_lat[0], np.array(lat), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[0], np.array(out), rtol=1e-10, atol=1e-12)


def test_mla_ignores_cache_slots_beyond_length_and_other_streams():
    rng = np.random.default_rng(8)
    cfg = TINY
    params, _ = ref.random_params(cfg, rng, experts_hf=False)
    attn = params["layers_0"]["self_attn"]
    x = rng.standard_normal((2, 3, cfg.hidden_size))
    cache = rng.standard_normal((2, 6, cfg.latent_dim))
    lens = np.array([2, 5])
    pos = lens[:, None] + np.arange(3)
    out, lat = ref.mla_attention(x, attn, pos, cache, lens, None, cfg)
    junk = cache.copy()
    junk[0, 2:] = 1e6
    junk[1, 5:] = np.nan
    out2, _ = ref.mla_attention(x, attn, pos, junk, lens, None, cfg)
    np.testing.assert_array_equal(out2, out)
    one, _ = ref.mla_attention(x[1:], attn, pos[1:], cache[1:, :5], lens[1:], None, cfg)
    np.testing.assert_allclose(one[0], out[1], rtol=1e-13, atol=1e-13)


# ---- whole decoder ---------------------------------------------------------------------------

def test_decoder_prefill_then_decode_equals_full_forward():
    rng = np.random.default_rng(9)
    cfg = TINY
    params, experts = ref.random_params(cfg, rng)
    tokens = rng.integers(0, cfg.vocab_size, size=(2, 6))
    taps = (2, 0)
    full, full_lat, full_taps = ref.decoder_forward(params, cfg, tokens, taps=taps, experts_hf=experts)
    assert full.shape == (2, 6, cfg.vocab_size) and full_taps.shape == (2, 6, 2 * cfg.hidden_size)
    assert len(full_lat) == cfg.num_hidden_layers and full_lat[0].shape == (2, 6, cfg.latent_dim)
    assert np.all(np.isfinite(full)) and full.std() > 0.1

    logits, lat, tp = ref.decoder_forward(params, cfg, tokens[:, :3], taps=taps, experts_hf=experts)
    cache = ref.extend_cache(None, lat)
    steps, step_taps = [logits], [tp]
    for t in range(3, 6):
        logits, lat, tp = ref.decoder_forward(params, cfg, tokens[:, t:t + 1], cache=cache, taps=taps,
                                              experts_hf=experts)
        cache = ref.extend_cache(cache, lat)
        steps.append(logits)
        step_taps.append(tp)
    np.testing.assert_allclose(np.concatenate(steps, 1), full, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(np.concatenate(step_taps, 1), full_taps, rtol=1e-10, atol=1e-10)
    np.testing.assert_array_equal(cache[1], [6, 6])
    for layer in range(cfg.num_hidden_layers):
        np.testing.assert_allclose(cache[0][layer], full_lat[layer], rtol=1e-12, atol=1e-12)


def test_decoder_chain_visibility_equals_causal_and_tree_masks_matter():
    rng = np.random.default_rng(10)
    cfg = TINY
    params, experts = ref.random_params(cfg, rng)
    tokens = rng.integers(0, cfg.vocab_size, size=(1, 4))
    causal, _, _ = ref.decoder_forward(params, cfg, tokens, experts_hf=experts)
    chain = np.tril(np.ones((4, 4), bool))[None]
    same, _, _ = ref.decoder_forward(params, cfg, tokens, visibility=chain, experts_hf=experts)
    np.testing.assert_array_equal(same, causal)
    # a tree: nodes 1 and 2 are both children of node 0; node 3 is a child of node 2.
    tree = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], bool)[None]
    pos = np.array([[0, 1, 1, 2]])
    got, _, _ = ref.decoder_forward(params, cfg, tokens, positions=pos, visibility=tree, experts_hf=experts)
    branch, _, _ = ref.decoder_forward(params, cfg, tokens[:, [0, 2, 3]], experts_hf=experts)
    np.testing.assert_allclose(got[:, [0, 2, 3]], branch, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got[:, :2], causal[:, :2], rtol=1e-10, atol=1e-10)
