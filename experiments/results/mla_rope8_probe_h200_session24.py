"""Which small-width pallas_triton MLA shapes are wrong on the GPU (session 24: two_words_bf16 failed)."""
import numpy as np, jax.numpy as jnp
from pallas_kernels.mla_attention import mla_attention, visibility_to_mask
from pallas_kernels.mla_attention.reference import mla_attention_reference
from tests.test_mla_attention import tree_visibility
from tests.kernel_testing import rel_err

rng = np.random.default_rng(1)
for dtype in (jnp.bfloat16, jnp.float16, jnp.float32):
    for dk, v in ((24, 16), (32, 16), (48, 32), (40, 32), (80, 64), (96, 64)):
        for num_q, ctx in ((37, [83, 1]), (5, [40, 3]), (1, [100, 7])):
            q = jnp.asarray(rng.standard_normal((2, num_q, 2, dk)), dtype)
            kv = jnp.asarray(rng.standard_normal((2, 120, dk)), dtype)
            vis = np.stack([tree_visibility(rng, num_q, "bushy") for _ in range(2)])
            mask = visibility_to_mask(vis)
            ctx_a = jnp.asarray(ctx, jnp.int32)
            ref = mla_attention_reference(q, kv, ctx_a, mask, scale=dk ** -0.5, v_dim=v)
            errs = {}
            for impl in ("xla", "pallas_triton"):
                try:
                    out = mla_attention(q, kv, ctx_a, mask, scale=dk ** -0.5, v_dim=v, impl=impl)
                    errs[impl] = f"{rel_err(out, ref):.1e}"
                except Exception as e:
                    errs[impl] = f"refused: {str(e)[:60]}"
            print(jnp.dtype(dtype).name, f"dk={dk} v={v} rope={dk - v} Q={num_q} ctx={ctx}", errs, flush=True)
