"""The K2.6 roofline: a hand-computed step, component formulas, the projection's measurement
(ddtree_jax/bench/projection.py)."""

import dataclasses
import itertools

import jax.numpy as jnp
import numpy as np
import pytest

import ddtree_jax as dj
from ddtree_jax.bench import calibration, projection
from ddtree_jax.bench import roofline as rf

TOY = rf.GPU("toy", hbm_tbs=1.0, copy_tbs=1.0, bf16_tflops=100.0, link_gbs=100.0, link="toy",
             link_latency_us=0.0, source="test")


def test_plain_decode_step_by_hand():
    """tiny preset, 1 GPU, 1 stream, budget 0 (T = 1), context 100, bare roofline: every part is
    memory-bound at 1 TB/s, so the step time is the bytes read / 1e12."""
    cfg = dj.ModelConfig.preset("tiny")          # d 64, 3 layers (layer 0 dense), H 4, E 16 top-4
    dep = rf.Deployment(cfg, dj.DrafterConfig.for_target(cfg), gpus=1, ctx=100)
    replicated = 64 * (48 + 32 + 8)              # q_a, kv_a (kv_lora + rope)
    mla = 48 * 4 * 24 + 32 * 4 * (16 + 16) + 4 * 16 * 64          # q_b, kv_b, o_proj
    dense = 2 * (replicated + mla + 3 * 64 * 128)                 # layer 0 with its dense MLP
    moe_rest = 2 * (replicated + 64 * 16 + mla + 3 * 64 * 32)     # router + shared expert
    experts = 4 * 3 * 64 * 32 * 0.5625                            # 4 active experts, INT4 + scales
    attention = 2 * (101 * 40 + 1 * 4 * (40 + 32))                # latent cache + q in / out
    head = 2 * 64 * 512
    total = dense + 2 * moe_rest + 2 * experts + 3 * attention + head
    st = rf.step_time(TOY, rf.UNIT, dep, streams=1, budget=0)
    assert st.total == pytest.approx(total / 1e12, rel=1e-9)
    assert st.moe == pytest.approx(2 * experts / 1e12)
    assert st.attention == pytest.approx(3 * attention / 1e12)
    assert st.comm == st.draft == st.tree == st.overhead == 0
    row = rf.project(TOY, rf.UNIT, dep, rf.DEFAULT_TAU, streams=1, budgets=())[0]
    assert row["tokens_per_second"] == pytest.approx(1e12 / total)


def test_k2_components_by_hand():
    cfg = dj.ModelConfig.preset("kimi_k2_6")
    # T = 1 over 8 GPUs: 8 active experts, one per GPU, 3 x 7168 x 2048 weights at 0.5625 B
    assert rf.moe_seconds(TOY, rf.UNIT, cfg, 1, 8) == pytest.approx(3 * 7168 * 2048 * 0.5625 / 1e12)
    # T = 4096: every expert active and compute-bound: 2 x 4096 x 8 x 3 x 7168 x 2048 / 8 FLOP at 100 TFLOP/s
    assert rf.moe_seconds(TOY, rf.UNIT, cfg, 4096, 8) == pytest.approx(
        2 * 4096 * 8 * 3 * 7168 * 2048 / 8 / 100e12)
    # attention S 2, Q 5, ctx 1000, 8 heads per GPU: bytes 2*2*(1005*576 + 5*8*1088) beat FLOPs
    assert rf.attention_seconds(TOY, rf.UNIT, cfg, 2, 5, 1000, 8) == pytest.approx(2489600 / 1e12)
    # compute-bound S 8, Q 17, ctx 4096 at 8 heads per GPU: 136 rows per stream computed as 3 blocks of 64
    padded = dataclasses.replace(rf.UNIT, attn_rows=64)
    assert rf.attention_seconds(TOY, padded, cfg, 8, 17, 4096, 8) == pytest.approx(
        2 * 8 * 192 * 4113 * 1088 / 100e12)
    assert rf.attention_seconds(TOY, rf.UNIT, cfg, 8, 17, 4096, 8) == pytest.approx(
        2 * 8 * 136 * 4113 * 1088 / 100e12)
    # ... and none at the shapes the "measured" attention calibration comes from (H 8 and 64,
    # Q 1-256 in powers of two): Q 1-4 at 8 heads pad to 64 rows but stay memory-bound
    h200, cal = rf.GPUS["H200"], calibration.calibrations()["measured"]
    for gpus, q, s, ctx in itertools.product((8, 1), (1, 2, 4, 16, 64, 256), (1, 16), (4096, 32768)):
        assert rf.attention_seconds(h200, cal, cfg, s, q, ctx, gpus) == rf.attention_seconds(
            h200, dataclasses.replace(cal, attn_rows=1), cfg, s, q, ctx, gpus)
    # ring all-reduce of 10 tokens x 7168 bf16 over 8 GPUs at 100 GB/s
    assert rf.allreduce_seconds(TOY, rf.UNIT, 10 * 7168 * 2, 8) == pytest.approx(
        2 * 7 / 8 * 143360 / 100e9)
    # per GPU of 8 under expert parallelism: its share of the slots and of the hit experts
    work = rf.expert_shard_work(cfg, 17, 8)
    assert work["rows"] == pytest.approx(17) and work["experts"] == pytest.approx(
        384 * (1 - (1 - 8 / 384) ** 17) / 8)
    assert work["bytes"] == pytest.approx(work["experts"] * 3 * 7168 * 2048 * 0.5625)
    assert work["flops"] == pytest.approx(2 * 17 * 3 * 7168 * 2048)
    assert rf.active_experts(1, 384, 8) == pytest.approx(8)
    assert rf.active_experts(10 ** 6, 384, 8) == pytest.approx(384)


def test_verify_part_floors_by_hand():
    """The tiny preset (3 layers: 1 dense, 2 MoE; d 64, 4 heads, q_lora 48, kv_lora 32, nope 16,
    rope 8, v 16; 16 experts top-4 of width 32, 1 shared; dense MLP 128; V 512), 2 streams x 3
    nodes against 10 cached tokens, at 1 TB/s copy and 1 TFLOP/s."""
    cfg = dj.ModelConfig.preset("tiny")
    f = rf.verify_part_floors(cfg, streams=2, q=3, ctx=10, copy_tbs=1.0, matmul_tflops=1.0)
    proj = 64 * (48 + 32 + 8) + 48 * 4 * 24 + 32 * 4 * (16 + 16) + 4 * 16 * 64        # 24,576 weights
    assert f["attention projections"]["bytes"] == 3 * proj * 2
    assert f["attention projections"]["flops"] == 3 * 2 * 6 * proj
    assert f["attention core"]["bytes"] == 3 * 2 * 2 * (13 * 40 + 3 * 4 * 72)
    assert f["attention core"]["flops"] == 3 * 2 * 2 * 3 * 4 * 13 * 72
    assert f["router"]["bytes"] == 2 * 64 * 16 * 2
    active = 16 * (1 - (1 - 4 / 16) ** 6)
    assert f["routed experts"]["bytes"] == pytest.approx(2 * active * 3 * 64 * 32 * 0.5625)
    assert f["routed experts"]["flops"] == 2 * 2 * 24 * 3 * 64 * 32
    assert f["MLP"]["flops"] == 6 * 6 * 64 * 128 and f["lm_head"]["bytes"] == 64 * 512 * 2
    for part in f.values():
        assert part["floor_us"] == pytest.approx(max(part["bytes"] / 1e12, part["flops"] / 1e12) * 1e6)
    from ddtree_jax.bench import timing
    assert set(f) <= {name for name, _ in timing.VERIFY_PARTS}


def test_projection_prefers_trees_when_verification_is_flat():
    """With weights dominating and a free draft, the best budget grows past the plain decode."""
    dep = rf.Deployment.kimi_k2_6()
    rows = rf.project(rf.GPUS["H200"], calibration.calibrations()["measured"], dep, rf.DEFAULT_TAU, streams=1)
    best = rf.best(rows)
    assert best["budget"] > 1 and best["tokens_per_second"] > rows[0]["tokens_per_second"]
    assert set(best["parts_ms"]) == {f.name for f in dataclasses.fields(rf.StepTime)}


def test_budgets_include_whole_block_trees():
    """At 8 heads per GPU a budget one short of a multiple of 8 (Q = budget + 1 nodes x 8 heads)
    fills whole 64-row attention blocks: every even budget in BUDGETS has that neighbour, whose
    attention FLOPs have no padded rows, while one node more starts a block of 8 real rows."""
    cfg = dj.ModelConfig.preset("kimi_k2_6")
    cal = dataclasses.replace(rf.UNIT, attn_rows=64)
    for b in rf.BUDGETS:
        if b % 8 == 0:
            assert b - 1 in rf.BUDGETS
            whole = rf.attention_seconds(TOY, cal, cfg, 8, b, 32768, 8)       # Q = b rows of 8 heads
            assert whole == pytest.approx(rf.attention_seconds(TOY, rf.UNIT, cfg, 8, b, 32768, 8))
            # Q = b + 1: one more 64-row block, of which 8 rows are real
            padded = rf.attention_seconds(TOY, cal, cfg, 8, b + 1, 32768, 8)
            assert padded == pytest.approx(2 * 8 * (b * 8 + 64) * (32768 + b + 1) * 1088 / 100e12)


def test_tau_curve_parse_and_interpolation():
    tau = rf.TauCurve.parse("64:5,8:3")
    assert tau.budgets == (8, 64)
    assert float(tau(8)) == 3 and float(tau(64)) == 5 and float(tau(1024)) == 5
    assert float(tau(np.sqrt(8 * 64))) == pytest.approx(4)


def test_measure_runs_on_the_tiny_preset():
    rows = projection.measure(dj.ModelConfig.preset("tiny"), [2], [1], ctx=8, dtype=jnp.float32,
                              reps=1)
    (row,) = rows
    assert row["tokens"] == 3 and row["forward_ms"] > 0 and row["moe_ms"] > 0
    assert {"attention_ms", "rest_ms", "head_ms"} <= set(row) and "moe_pct_floor" not in row
    assert row["parts_clock"] == "wall"         # device time from a trace on a GPU only
    ceilings = dict(copy_tbps=1.0, matmul_tflops_xla=1.0, matmul_tflops_torch=2.0)
    (row,) = projection.measure(dj.ModelConfig.preset("tiny"), [2], [1], ctx=8, dtype=jnp.float32,
                                reps=1, ceilings=ceilings)
    assert row["moe_pct_floor"] > 0 and row["attn_pct_floor"] > 0
    rows = projection.measure(dj.ModelConfig.preset("tiny"), [2], [3], ctx=8, dtype=jnp.float32, reps=1,
                              lengths=("spread",), balances=(True, False))
    assert [(r["lengths"], r["attn_balance"]) for r in rows] == [("spread", True), ("spread", False)]
    assert rows[0]["moe_ms"] == rows[1]["moe_ms"]       # timed once per token count


def test_measure_checks_the_kernels_before_timing():
    ones = lambda x: x                                  # noqa: E731
    projection.check_against_xla("same", ones, ones, jnp.ones(4))
    with pytest.raises(AssertionError, match="off: relative error 5.00e-01"):
        projection.check_against_xla("off", ones, lambda x: 2 * x, jnp.ones(4))


def test_best_budget_per_hardware_and_the_tau_curve():
    dep = rf.Deployment.kimi_k2_6(ctx=4096)
    rows, best = projection.best_budgets(dep, rf.DEFAULT_TAU, ["H200"], ["measured"], [1, 10])
    assert [b["streams"] for b in best] == [1, 10] and len(rows) > len(best)
    for b in best:
        assert b["speedup_over_ar"] == pytest.approx(b["tokens_per_second"] / b["ar_tokens_per_second"])
        assert b["step_ms"] > 0 and b["moe_ms"] > 0
    assert projection.tau_curve() is rf.DEFAULT_TAU
    assert projection.tau_curve("64:5,8:3").budgets == (8, 64)
