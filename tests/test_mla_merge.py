"""The split runs' merge kernel (pallas_kernels/mla_attention/merge.py) against a float64 numpy
merge: parts that saw no key (-inf lse), rows no part saw (zeros), K not a multiple of the step,
one part, float32 and bf16 parts; outputs NaN-poisoned before the run."""

import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.mla_attention import merge
from tests.kernel_testing import assert_close, fresh_rng


def golden(o, lse):
    o, lse = np.asarray(o, np.float64), np.asarray(lse, np.float64)
    top = lse.max(0)
    w = np.exp2(lse - np.where(np.isfinite(top), top, 0.0))
    den = w.sum(0)
    return (w[..., None] * o).sum(0) / np.where(den > 0, den, 1.0)[..., None]


@pytest.mark.parametrize("form", merge.FORMS)
@pytest.mark.parametrize("k,s,r,v,kc,dtype", [(1, 1, 8, 64, 16, jnp.bfloat16), (3, 2, 16, 128, 2, jnp.float32),
                                              (16, 1, 64, 64, 16, jnp.bfloat16), (13, 3, 8, 64, 4, jnp.bfloat16),
                                              (5, 1, 8, 32, 16, jnp.float32)])
def test_merge_matches_golden(k, s, r, v, kc, dtype, form):
    """K = 13 by 4 and K = 5 by (at most) 4: "parts" masks the parts past K in its last step
    (loads past the arrays, predicated off) and must count none of them."""
    rng = fresh_rng()
    o = jnp.asarray(rng.standard_normal((k, s, r, v)), dtype)
    lse = (rng.standard_normal((k, s, r)) * 4).astype(np.float32)
    lse[0, 0, :2] = -np.inf                  # a part that saw no key for two rows
    if k > 1:
        lse[:, -1, 3] = -np.inf              # a row no part saw
    out = merge.merge_splits(o, jnp.asarray(lse), jnp.float32, jnp.full((s, r, v), jnp.nan, jnp.float32), kc=kc,
                             form=form)
    want = golden(o, lse)
    assert np.all(np.isfinite(np.asarray(out)))
    if k > 1:
        assert np.all(np.asarray(out)[-1, 3] == 0)
    assert_close(out, want, 1e-6, f"merge K{k} S{s}")
    out16 = merge.merge_splits(o, jnp.asarray(lse), jnp.bfloat16, kc=kc, form=form)
    assert out16.dtype == jnp.bfloat16
    assert_close(out16, want, 8e-3, f"merge K{k} S{s} bf16 out")


def test_merge_refuses_bad_shapes():
    o = jnp.zeros((2, 1, 8, 64), jnp.bfloat16)
    with pytest.raises(ValueError, match="lse"):
        merge.merge_splits(o, jnp.zeros((2, 1, 4), jnp.float32))
    with pytest.raises(ValueError, match="rows"):
        merge.merge_splits(jnp.zeros((2, 1, 6, 64)), jnp.zeros((2, 1, 6), jnp.float32))
    with pytest.raises(ValueError, match="out"):
        merge.merge_splits(o, jnp.zeros((2, 1, 8), jnp.float32), out=jnp.zeros((1, 8, 32)))
    with pytest.raises(ValueError, match="form"):
        merge.merge_splits(o, jnp.zeros((2, 1, 8), jnp.float32), form="columns")
    with pytest.raises(ValueError, match="kc"):
        merge.merge_splits(o, jnp.zeros((2, 1, 8), jnp.float32), kc=12)


def test_merge_form_for_the_run_count():
    """form=None takes form_for(K): "rows" up to 16 runs, "parts" above; either form gives the
    other's numbers (float32 sums in another order) and the golden's."""
    assert [merge.form_for(k) for k in (1, 8, 16, 17, 65, 132)] == ["rows"] * 3 + ["parts"] * 3
    rng = fresh_rng()
    for k in (16, 17):
        o = jnp.asarray(rng.standard_normal((k, 1, 8, 64)), jnp.bfloat16)
        lse = jnp.asarray(rng.standard_normal((k, 1, 8)) * 4, jnp.float32)
        other = {"rows": "parts", "parts": "rows"}[merge.form_for(k)]
        auto = merge.merge_splits(o, lse)
        assert_close(auto, merge.merge_splits(o, lse, form=other), 1e-6, f"merge K{k}: the two forms")
        assert_close(auto, golden(o, lse), 1e-6, f"merge K{k} form=None")


def test_mosaic_refuses_an_unknown_merge():
    from pallas_kernels.mla_attention import mosaic_gpu
    with pytest.raises(ValueError, match="merge must be one of"):
        mosaic_gpu.mla_attention_mosaic(jnp.zeros((1, 1, 1, 64)), jnp.zeros((1, 128, 64)), jnp.zeros((1,), jnp.int32),
                                        jnp.zeros((1, 1, 1), jnp.int32), scale=0.1, v_dim=32, merge="nope")
