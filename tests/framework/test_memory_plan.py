"""Memory plan: a hand-computed tiny deployment, the full K2.6 on 8 H200s, and the plan's shard
arithmetic against the real NamedShardings on 8 simulated CPU devices (in a subprocess: the device
count must be set before JAX starts)."""

import math
import os
import subprocess
import sys

import jax
import pytest

import ddtree_jax as dj
from ddtree_jax.bench import memory_plan as mp
from tests import ROOT

TINY = dj.ModelConfig.preset("tiny", quant=dj.QuantConfig("int4", 32))
K2 = dj.ModelConfig.preset("kimi_k2_6")


@pytest.mark.parametrize("cfg", [TINY, mp.truncate(K2, 5), dj.ModelConfig.preset("tiny").replace(
    num_hidden_layers=7, first_k_dense_replace=2, moe_layer_freq=2)], ids=["tiny", "k2.6-5-layers", "freq-2"])
def test_target_shapes_equal_tracing_every_layer(cfg):
    """target_shapes traces one layer of each kind and shares it: the same pytree, shapes and
    dtypes as eval_shape of init_target over every layer (a model whose MoE layers alternate with
    dense ones after two dense layers too)."""
    import functools

    import jax.numpy as jnp

    from ddtree_jax import model as tgt
    want = jax.eval_shape(functools.partial(tgt.init_target, cfg, dtype=jnp.bfloat16), jax.random.key(0))
    got = mp.target_shapes(cfg, "bfloat16")
    assert jax.tree.structure(got) == jax.tree.structure(want)
    assert jax.tree.leaves(got) == jax.tree.leaves(want)
    assert len([k for k in got if k.startswith("layers_")]) == cfg.num_hidden_layers


def test_tiny_plan_by_hand():
    """tiny with INT4 experts on mesh (data 1, expert 2, tensor 2), S 2, context 10, budget 4, bf16."""
    dcfg = dj.DrafterConfig.for_target(TINY)      # 1 layer, 4 heads, 1 KV head of 16, I 192, 1 tap
    p = mp.plan(TINY, dcfg, (1, 2, 2), mp.Workload(streams=2, context=10, budget=4))
    bf = 2
    assert p.params["embed"] == p.params["lm_head"] == 512 // 2 * 64 * bf            # vocab / tensor
    # per layer: q_a [64,48], kv_a [64,40] replicated; q_b [48,96], kv_b [32,128] columns and
    # o_proj [64,64] rows over tensor
    assert p.params["attention"] == 3 * bf * (64 * 48 + 64 * 40 + 48 * 48 + 32 * 64 + 32 * 64)
    assert p.params["norms"] == bf * (3 * (64 + 64 + 48 + 32) + 64)
    assert p.params["dense_mlp"] == bf * 3 * 64 * 64                                  # 128 / tensor
    assert p.params["shared_experts"] == 2 * bf * 3 * 64 * 16                         # 32 / tensor
    assert p.params["router"] == 2 * (bf * 64 * 16 + 4 * 16)                          # + f32 bias
    # 16 experts over expert x tensor = 4 per device; K padded to 256: gate/up qweight [256/8, 32]
    # int32 + qscale [256/32, 32] bf16, down qweight [256/8, 64] + qscale [8, 64]
    assert p.params["routed_qweight"] == 2 * 4 * 4 * (32 * 32 * 2 + 32 * 64)
    assert p.params["routed_qscale"] == 2 * 4 * bf * (8 * 32 * 2 + 8 * 64)
    # drafter: q_proj/o_proj 64x64 and k/v_proj 64x16 halved over tensor (16 % 2 == 0), MLP halved,
    # fc 64x64 replicated, norms (q/k_norm 16, layer norms 64 x 2, final and hidden norm 64)
    assert p.drafter_params == bf * (2 * 64 * 32 + 2 * 64 * 8 + 3 * 64 * 96 + 64 * 64
                                     + 2 * 16 + 2 * 64 + 2 * 64)
    # caches: 16 slots (10 + 4 + 1 = 15, aligned to 8); latent 3 layers x [2, 16, 40]; drafter
    # k, v [1, 2, 16, 1, 16]
    assert p.caches == {"target_latent": 3 * 2 * 16 * 40 * bf, "drafter_kv": 2 * 2 * 16 * 16 * bf}
    t = 2 * 5                                                                         # local tokens
    a = p.activations
    assert a["residual"] == 3 * t * 64 * bf and a["taps"] == t * 64 * bf
    assert a["mla"] == t * ((48 + 2 * (24 + 40 + 16)) * bf + 2 * 32 * 4)              # 2 heads / device
    assert a["moe"] == t * 4 * (32 * bf + 64 * 4)                                    # slot layout, top-4
    assert a["logits"] == t * 256 * 4 and a["dense_mlp"] == 3 * t * 64 * bf
    assert a["peak"] == a["residual"] + a["taps"] + a["moe"]
    assert p.total == sum(p.params.values()) + p.drafter_params + sum(p.caches.values()) + a["peak"]
    assert p.fits and p.row()["params_gb"] == pytest.approx(sum(p.params.values()) / 1e9)


def test_full_k2_on_8_h200():
    """Budget 256, 16 streams, context 4096: tensor-parallel fits, replicating experts over data does not."""
    work = mp.Workload(streams=16, context=4096, budget=256)
    plans = {p.mesh: p for p in mp.plans_for(K2, dj.DrafterConfig.for_target(K2), 8, work)}
    assert set(plans) == set(mp.mesh_shapes(8)) and len(plans) == 10
    tp = plans[(1, 1, 8)]
    # 60 MoE layers x 384 experts x 3 x 7168 x 2048 weights: nibbles + bf16 group-32 scales, 1/8 each
    assert tp.params["routed_qweight"] == 60 * 384 * 3 * 7168 * 2048 // 2 // 8
    assert tp.params["routed_qscale"] == 60 * 384 * 3 * 7168 * 2048 // 32 * 2 // 8
    assert tp.caches["target_latent"] == 61 * 16 * 4360 * 576 * 2     # 4096 + 257 slots, aligned; replicated
    assert tp.fits and plans[(1, 8, 1)].fits and not plans[(2, 1, 4)].fits
    assert tp.max_context > 4096
    smallest = mp.smallest_fit(K2, dj.DrafterConfig.for_target(K2), work)
    assert smallest.fits and 5 <= math.prod(smallest.mesh) <= 8         # 594 GB of params in all


def test_max_layers_and_first_layers():
    work = mp.Workload(streams=16, context=4096, budget=256)
    n = mp.max_layers(K2, (1, 1, 1), work)
    fits = lambda k: mp.plan(mp.truncate(K2, k), dj.DrafterConfig.for_target(mp.truncate(K2, k)),
                             (1, 1, 1), work).fits
    assert 1 <= n < 61 and fits(n) and not fits(n + 1)
    assert mp.max_layers(TINY, (1, 1, 1), work) == 3
    cut = mp.first_layers(mp.target_shapes(TINY), 2)
    want = mp.target_shapes(mp.truncate(TINY, 2))
    assert jax.tree.structure(cut) == jax.tree.structure(want)
    leaves = lambda tree: [(x.shape, x.dtype) for x in jax.tree.leaves(tree)]
    assert leaves(cut) == leaves(want)


def test_bad_arguments():
    with pytest.raises(ValueError, match="Workload.streams"):
        mp.Workload(streams=0, context=1, budget=1)
    with pytest.raises(ValueError, match="Workload.dtype"):
        mp.Workload(streams=1, context=1, budget=1, dtype="int5")
    with pytest.raises(ValueError, match="three positive"):
        mp.abstract_mesh((1, 2))
    with pytest.raises(ValueError, match="device must be one of"):
        mp.plan(TINY, dj.DrafterConfig.for_target(TINY), (1, 1, 1), mp.Workload(1, 1, 1), device="H900")
    with pytest.raises(ValueError, match="layers must lie"):
        mp.truncate(TINY, 4)


_CHECK = """
import jax, numpy as np, math
import ddtree_jax as dj
from ddtree_jax import sharding
from ddtree_jax.bench import memory_plan as mp
cfg = dj.ModelConfig.preset("kimi_k2_6")
dcfg = dj.DrafterConfig.for_target(cfg)
work = mp.Workload(streams=16, context=4096, budget=256)
target, drafter = mp.target_shapes(cfg), mp.drafter_shapes(dcfg)

def per_device(shapes, shardings):
    total = {d: 0 for d in jax.devices()}
    for x, s in zip(jax.tree.leaves(shapes), jax.tree.leaves(shardings)):
        for d, index in s.devices_indices_map(x.shape).items():
            n = math.prod(len(range(*i.indices(dim))) for i, dim in zip(index, x.shape))
            total[d] += n * x.dtype.itemsize
    assert len(set(total.values())) == 1, total
    return total[jax.devices()[0]]

for shape in mp.mesh_shapes(8):
    mesh = sharding.make_mesh(shape)
    p = mp.plan(cfg, dcfg, shape, work)
    got = per_device(target, sharding.param_shardings(target, mesh))
    assert got == sum(p.params.values()), (shape, got, sum(p.params.values()))
    assert per_device(drafter, sharding.param_shardings(drafter, mesh)) == p.drafter_params, shape
    print("ok", shape, got)
"""


def test_plan_equals_named_shardings_on_8_devices():
    """Per-device param bytes of the plan == the sum of the slices the real NamedShardings (the ones
    init_target / load_target place with) give each of 8 devices, full K2.6, every 8-device mesh."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8")
    proc = subprocess.run([sys.executable, "-c", _CHECK], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert proc.stdout.count("ok ") == 10, proc.stdout
