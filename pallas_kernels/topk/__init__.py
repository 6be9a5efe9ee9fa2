"""Operation "topk": the k largest entries of each row, and a fused variant with the row logsumexp.

    topk(x [R, V] float, k) -> (values [R, k] float32 descending, indices [R, k] int32)
    topk_logsumexp(x, k) -> (values, indices, lse [R] float32)

x may be float32, bfloat16 or float16 (the values are x's, converted exactly to float32).

Ties go to the lower index; -0.0 and 0.0 are equal; x must not hold NaN. Implementations: "xla"
(`jax.lax.top_k`) and "pallas_triton" (a threshold selection that reads x once, see
`pallas_kernels.topk.pallas_triton`). The golden is `pallas_kernels.topk.reference.topk_reference`.
Design note: docs/kernels/topk.md.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels import registry
from pallas_kernels.topk import pallas_triton as _pallas_triton  # noqa: F401  (registers)


def check_args(x, k) -> None:
    """Raise ValueError unless x is a float32-castable [R, V] array and 1 <= k <= V."""
    if getattr(x, "ndim", None) != 2:
        raise ValueError(f"x must be [R, V]; got shape {getattr(x, 'shape', None)}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"x must be floating point; got {x.dtype}")
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= x.shape[1]:
        raise ValueError(f"k must be an int in [1, V={x.shape[1]}]; got {k!r}")


def _top_k(x: jax.Array, k: int):
    """jax.lax.top_k on float32 x with -0.0 taken as 0.0 (lax.top_k ranks -0.0 below 0.0)."""
    return jax.lax.top_k(jnp.where(x == 0, 0.0, x), k)


@registry.register("topk", "xla")
def topk_xla(x: jax.Array, k: int):
    return _top_k(x.astype(jnp.float32), k)


@registry.register("topk_logsumexp", "xla")
def topk_logsumexp_xla(x: jax.Array, k: int):
    x = x.astype(jnp.float32)
    values, indices = _top_k(x, k)
    return values, indices, jax.nn.logsumexp(x, axis=-1)


def topk(x: jax.Array, k: int, *, impl: str = "auto"):
    """x [R, V] -> (values [R, k] float32 descending, indices [R, k] int32); ties -> lower index."""
    check_args(x, k)
    return registry.get("topk", impl)(x, k)


def topk_logsumexp(x: jax.Array, k: int, *, impl: str = "auto"):
    """`topk` plus lse [R] = log(sum(exp(x), -1)) in float32, from the same pass over x."""
    check_args(x, k)
    return registry.get("topk_logsumexp", impl)(x, k)
