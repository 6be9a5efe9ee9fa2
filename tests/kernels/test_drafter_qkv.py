"""The drafter's fused projection ("drafter_qkv"): every implementation against the float64 numpy
golden, outputs poisoned, argument checks, and the drafter's forward equal across implementations."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ddtree_jax as dj
from ddtree_jax import drafter as dr
from ddtree_jax import rope
from pallas_kernels.drafter_qkv import drafter_qkv
from pallas_kernels.drafter_qkv.pallas_triton import drafter_qkv_pallas
from pallas_kernels.drafter_qkv.reference import drafter_qkv_reference
from tests.kernel_testing import assert_close, fresh_rng, runnable_impls
from tests import ROOT


def _inputs(rng, bsz, t, d, h, kvh, hd, with_q=True, with_norm=True, dtype=np.float32):
    """x, positions, wq, wk, wv, q_norm, k_norm, inv_freq, norm: weights scaled like trained ones
    (products of order 1), norm scales around 1."""
    draw = lambda *shape, s=1.0: (rng.standard_normal(shape) * s).astype(dtype)   # noqa: E731
    near1 = lambda n: (1 + 0.2 * rng.standard_normal(n)).astype(dtype)          # noqa: E731
    return (draw(bsz, t, d), rng.integers(0, 2000, (bsz, t)).astype(np.int32),
            draw(d, h * hd, s=d ** -0.5) if with_q else None, draw(d, kvh * hd, s=d ** -0.5),
            draw(d, kvh * hd, s=d ** -0.5), near1(hd) if with_q else None, near1(hd),
            rope.inv_freq(hd, 1e6).astype(np.float32), near1(d) if with_norm else None)


def _run(impl, args, eps=1e-6, **kw):
    *arrays, inv, norm = args
    j = lambda a: None if a is None else jnp.asarray(a)   # noqa: E731
    if impl == "pallas_poison":
        return drafter_qkv_pallas(*map(j, arrays), j(inv), norm=j(norm), eps=eps, poison=True, **kw)
    return drafter_qkv(*map(j, arrays), inv, norm=j(norm), eps=eps, impl=impl)


def _golden(args, eps=1e-6):
    *arrays, inv, norm = args
    return drafter_qkv_reference(*arrays, inv, norm=norm, eps=eps)


# (B, T, d, H, KV, hd, with_q, with_norm): the shipped drafter's block (d 256, 4 heads over one KV
# head of 64), its context (no q, hidden_norm), grouped heads with d not a power of two and rows
# not a multiple of 16, and k/v only without a norm
SHAPES = [(1, 16, 256, 4, 1, 64, True, True), (3, 7, 256, 0, 1, 64, False, True),
          (2, 5, 48, 4, 2, 16, True, True), (1, 33, 32, 0, 2, 32, False, False)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("impl", runnable_impls("drafter_qkv") + ["pallas_poison"])
def test_matches_golden_float32(impl, shape):
    rng = fresh_rng()
    args = _inputs(rng, *shape)
    got, want = _run(impl, args), _golden(args)
    b, t, _, h, kvh, hd, with_q, _ = shape
    assert (got[0] is None) == (not with_q)
    for name, g, w, heads in zip("qkv", got, want, (h, kvh, kvh)):
        if w is None:
            continue
        assert g.shape == (b, t, heads, hd) and g.dtype == jnp.float32
        assert_close(g, w, 2e-6, f"{impl} {name}")


@pytest.mark.parametrize("shape", [(2, 16, 256, 4, 1, 64), (1, 5, 8, 2, 1, 16)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("impl", runnable_impls("drafter_qkv") + ["pallas_poison"])
def test_matches_golden_bfloat16(impl, shape):
    """bf16 operands, float32 accumulation, intermediates rounded to bf16 where the module rounds:
    relative error within 6e-3 of the float64 golden (the 1x5x8x2x1x16 shape's worst of q, k, v
    over 2000 seeds: median 3.3e-3, maximum 4.6e-3 (xla; pallas_triton the same over 150)). A
    hidden width of 8 takes pallas_compat.dot_f32's K < 16 path."""
    rng = fresh_rng()
    args = list(_inputs(rng, *shape))
    bf = [a if a is None or a.dtype == np.int32 or i == 7 else np.asarray(jnp.asarray(a, jnp.bfloat16))
          for i, a in enumerate(args)]
    want = _golden([a if a is None or a.dtype == np.int32 else np.asarray(a, np.float64) for a in bf])
    j = [a if a is None or a.dtype == np.int32 or i == 7 else jnp.asarray(a, jnp.bfloat16)
         for i, a in enumerate(bf)]
    *arrays, inv, norm = j
    if impl == "pallas_poison":
        got = drafter_qkv_pallas(*map(lambda a: None if a is None else jnp.asarray(a), arrays),
                                 jnp.asarray(inv), norm=norm, eps=1e-6, poison=True)
    else:
        got = drafter_qkv(*map(jnp.asarray, arrays), inv, norm=norm, eps=1e-6, impl=impl)
    for name, g, w in zip("qkv", got, want):
        assert g.dtype == jnp.bfloat16
        assert_close(g, w, 6e-3, f"{impl} {name}")


def test_pallas_agrees_with_xla_in_bfloat16():
    """Both round at the same points, so they differ by a bf16 ulp here and there, not more."""
    rng = fresh_rng()
    *arrays, inv, norm = _inputs(rng, 4, 16, 256, 4, 1, 64)
    bf = lambda a: jnp.asarray(a, jnp.bfloat16)   # noqa: E731
    args = (bf(arrays[0]), jnp.asarray(arrays[1]), *map(bf, arrays[2:]))
    outs = [drafter_qkv(*args, inv, norm=bf(norm), eps=1e-6, impl=i) for i in ("xla", "pallas_triton")]
    for a, b in zip(*outs):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.abs(a - b).max() <= 2 ** -6 * np.abs(a).max()


@pytest.mark.parametrize("change, match", [
    (dict(x=np.zeros((2, 16))), "x must be"),
    (dict(positions=np.zeros((1, 16), np.float32)), "positions must be integer"),
    (dict(wk=np.zeros((255, 64), np.float32)), "wk must be"),
    (dict(wv=np.zeros((256, 128), np.float32)), "wv must have shape"),
    (dict(q_norm=None), "wq and q_norm"),
    (dict(inv_freq=np.zeros(16, np.float32)), "inv_freq must have shape"),
    (dict(norm=np.zeros(128, np.float32)), "norm must have shape"),
])
def test_bad_arguments_are_named(change, match):
    names = ("x", "positions", "wq", "wk", "wv", "q_norm", "k_norm", "inv_freq", "norm")
    args = dict(zip(names, _inputs(fresh_rng(), 1, 16, 256, 4, 1, 64)))
    args.update(change)
    norm = args.pop("norm")
    with pytest.raises(ValueError, match=match):
        drafter_qkv(*(None if v is None else jnp.asarray(v) for v in args.values()),
                    norm=None if norm is None else jnp.asarray(norm), eps=1e-6, impl="xla")


def test_pallas_refuses_a_head_dim_it_cannot_take():
    """The kernel's RoPE halves are power-of-two aranges: head_dim 48 is refused by name (impl
    "auto" on a GPU then takes "xla", tests/kernels/test_registry.py)."""
    x, pos, wq, wk, wv, qn, kn, inv, norm = _inputs(fresh_rng(), 1, 4, 32, 2, 1, 48)
    with pytest.raises(ValueError, match="head_dim = 2 x a power of two.*head_dim=48"):
        drafter_qkv_pallas(*map(jnp.asarray, (x, pos, wq, wk, wv, qn, kn, inv)), norm=jnp.asarray(norm), eps=1e-6)


def test_drafter_equal_across_implementations():
    """The cached drafter (context append, then a block) gives the same hidden states with the
    projection and attention kernels as with the xla path (float32)."""
    tcfg = dj.ModelConfig.preset("tiny")
    dcfg = dj.DrafterConfig.for_target(tcfg, num_hidden_layers=2, block_size=8)
    k0, k1, k2 = jax.random.split(jax.random.key(int(fresh_rng().integers(2**31))), 3)
    params = dj.init_drafter(dcfg, k0)
    taps = jax.random.normal(k1, (2, 12, len(dcfg.target_layer_ids) * tcfg.hidden_size))
    pos = jnp.broadcast_to(jnp.arange(12, dtype=jnp.int32), (2, 12))
    emb = jax.random.normal(k2, (2, 8, tcfg.hidden_size))
    outs = []
    for impl in ("xla", "pallas_triton"):
        cache = dr.init_drafter_cache(dcfg, 2, 32, jnp.float32)
        cache = dr.append_context(params, dcfg, cache, taps, pos, jnp.asarray([12, 5], jnp.int32),
                                  attn_impl=impl)
        blk_pos = cache.lengths[:, None] + jnp.arange(8, dtype=jnp.int32)
        outs.append((cache, dr.draft_block(params, dcfg, cache, emb, blk_pos, attn_impl=impl)))
    (ca, ha), (cb, hb) = outs
    for a, b in ((ca.k, cb.k), (ca.v, cb.v), (ha, hb)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-5)


def test_kernel_packages_import_first():
    """Each kernel package imports on its own, before ddtree_jax (which imports them): no cycle."""
    root = ROOT
    for module in ("pallas_kernels.drafter_qkv", "pallas_kernels.tree_accept", "pallas_kernels.registry"):
        subprocess.run([sys.executable, "-c", f"import {module}"], cwd=root, check=True,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
