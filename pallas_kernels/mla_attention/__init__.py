"""MLA tree-verify attention over the latent cache (operation "mla_attention").

Absorbed MLA is multi-query attention: H query heads share one latent KV head of width Dk
(kv_lora + rope); values are the first `v_dim` latent channels. Query i of stream s attends to
cache slots j < ctx_lens[s] and to the Q new tokens (slots ctx_lens[s] + t) its ancestor bitmask
allows. Implementations: "xla" (chunked pure JAX), "pallas_triton" (a one-pass flash-decoding
kernel, pallas_triton.py, or for K2-size verify shapes a scores GEMM and a P @ V GEMM, two_pass.py;
pallas_triton.select_config picks), "mosaic_gpu" (Hopper: a warp-specialised Mosaic GPU kernel
over the context and then the tree tokens under per-row mask words, mosaic_gpu.py; each
stream's keys split over CTAs when too few fill the GPU). "auto" on a GPU: mosaic_gpu on Hopper
for caches of 4096 slots or more or calls of 128 row blocks or more (mosaic_gpu.choose), else
pallas_triton. Design note: docs/kernels/mla_attention.md.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from pallas_kernels import registry
from pallas_kernels.checks import concrete
from pallas_kernels.mla_attention import mosaic_gpu, pallas_triton, xla  # noqa: F401  (registers impls)

__all__ = ["mla_attention", "visibility_to_mask", "mask_to_visibility", "mask_words"]


def mask_words(num_q: int) -> int:
    """Number of int32 words per row of a node mask for Q new tokens: ceil(Q/32)."""
    return -(-num_q // 32)


def visibility_to_mask(visibility) -> jax.Array:
    """visibility [S, Q, Q] bool (row i sees token t) -> node_mask [S, Q, ceil(Q/32)] int32."""
    visibility = jnp.asarray(visibility)
    if visibility.ndim != 3 or visibility.shape[1] != visibility.shape[2]:
        raise ValueError(f"visibility must be [S, Q, Q]; got shape {visibility.shape}")
    num_s, num_q, _ = visibility.shape
    words = mask_words(num_q)
    bits = jnp.pad(visibility.astype(jnp.uint32), ((0, 0), (0, 0), (0, 32 * words - num_q)))
    bits = bits.reshape(num_s, num_q, words, 32) << jnp.arange(32, dtype=jnp.uint32)
    return jax.lax.bitcast_convert_type(bits.sum(axis=-1, dtype=jnp.uint32), jnp.int32)


def mask_to_visibility(node_mask, num_q: int) -> jax.Array:
    """node_mask [S, Q, ceil(Q/32)] int32 -> visibility [S, Q, Q] bool (inverse of visibility_to_mask)."""
    node_mask = jnp.asarray(node_mask)
    t = jnp.arange(num_q)
    words = jax.lax.bitcast_convert_type(node_mask, jnp.uint32)[:, :, t // 32]
    return ((words >> (t % 32).astype(jnp.uint32)) & 1).astype(bool)


def _validate(q, kv, ctx_lens, node_mask, scale, v_dim, heads_first=False, q_rope=None) -> None:
    lead = 'H, Q' if heads_first else 'Q, H'
    if q.ndim != 4:
        raise ValueError(f"q must be [S, {lead}, Dk]; got shape {q.shape}")
    num_s, num_q, dk = q.shape[0], q.shape[2 if heads_first else 1], q.shape[3]
    if q_rope is not None:
        if q.shape[3] != v_dim:
            raise ValueError(f"with q_rope, q must hold only the latent part [S, {lead}, v_dim={v_dim}]; "
                             f"got shape {q.shape}")
        if q_rope.ndim != 4 or q_rope.shape[:3] != q.shape[:3] or q_rope.dtype != q.dtype:
            raise ValueError(f"q_rope must be {q.dtype} [S, {lead}, Dk - v_dim] = {q.shape[:3]} + (R,); "
                             f"got {q_rope.dtype}{q_rope.shape}")
        dk = v_dim + q_rope.shape[3]
    if kv.ndim != 3 or kv.shape[0] != num_s or kv.shape[2] != dk:
        raise ValueError(f"kv must be [S={num_s}, N, Dk={dk}]; got shape {kv.shape}")
    if kv.shape[1] < num_q:
        raise ValueError(f"kv has {kv.shape[1]} slots, fewer than the Q={num_q} new tokens")
    if ctx_lens.shape != (num_s,) or not jnp.issubdtype(ctx_lens.dtype, jnp.integer):
        raise ValueError(f"ctx_lens must be integer [S={num_s}]; got {ctx_lens.dtype}{ctx_lens.shape}")
    if node_mask.shape != (num_s, num_q, mask_words(num_q)) or node_mask.dtype != jnp.int32:
        raise ValueError(f"node_mask must be int32 [S, Q, ceil(Q/32)] = {(num_s, num_q, mask_words(num_q))}; "
                         f"got {node_mask.dtype}{node_mask.shape}")
    if not 0 < v_dim <= dk:
        raise ValueError(f"v_dim must be in (0, Dk={dk}]; got {v_dim}")
    if not (isinstance(scale, (int, float)) and math.isfinite(scale)):
        raise ValueError(f"scale must be a finite Python float; got {scale!r}")
    lens = concrete(ctx_lens)
    if lens is not None and (lens.min(initial=0) < 0 or lens.max(initial=0) + num_q > kv.shape[1]):
        raise ValueError(f"ctx_lens must satisfy 0 <= ctx_lens and ctx_lens + Q <= N={kv.shape[1]}; "
                         f"got {lens.tolist()}")


def mla_attention(q, kv, ctx_lens, node_mask, *, scale: float, v_dim: int, impl: str = "auto",
                  heads_first: bool = False, q_rope=None, balance: bool = False) -> jax.Array:
    """Tree-verify attention: q [S,Q,H,Dk], kv [S,N,Dk], ctx_lens [S] int32,
    node_mask [S,Q,ceil(Q/32)] int32 -> [S,Q,H,v_dim] in q.dtype (softmax in float32).
    heads_first: q [S,H,Q,Dk] -> [S,H,Q,v_dim], the layout of a per-head batched matmul's output.
    q_rope: the query's rope part [S,Q,H,Dk-v_dim] (heads_first: [S,H,Q,.]) given on its own, q
    then holding only the latent part [.., v_dim]: the absorbed model computes the two apart, and
    passing them so writes no concatenated [.., Dk] query.
    balance: a scheduling hint for ragged contexts, the same result either way: "mosaic_gpu"
    shares its split runs out by the streams' lengths and launches its CTAs longest work first
    (mosaic_gpu.launch and context_attention's balance: a small cost with equal contexts, a large
    gain with spread ones, docs/kernels/mla_attention.md; off here, on in model.forward); "xla"
    and "pallas_triton" have nothing to schedule and ignore it."""
    q, kv, ctx_lens, node_mask = map(jnp.asarray, (q, kv, ctx_lens, node_mask))
    q_rope = None if q_rope is None else jnp.asarray(q_rope)
    _validate(q, kv, ctx_lens, node_mask, scale, v_dim, heads_first, q_rope)
    fn = registry.get("mla_attention", impl)
    return fn(q, kv, ctx_lens.astype(jnp.int32), node_mask, scale=float(scale), v_dim=int(v_dim),
              heads_first=bool(heads_first), q_rope=q_rope, balance=bool(balance))
