"""In-kernel selection helpers shared by the Pallas:Triton kernels of topk, tree_search and
tree_accept: order-preserving int32 keys of floats, the bisection that finds a set of the first
k..cap entries in (key desc, order asc) order, compaction and scatter indices, and a barrier.
Called inside Pallas:Triton kernels (and in interpret mode off the GPU)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.pallas_compat import plgpu

INT_MIN = -(2**31)
INT_MAX = 2**31 - 1
NOWHERE = 2**30  # index of a masked-off scattered lane: out of range, so interpret mode drops it


def pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def keys(v, shift: int = 0):
    """float32 -> int32 keys whose signed order is the float order, with -0.0 == 0.0.

    shift: low bits that are the same for every key of one sign (16 for float32 values widened
    from bf16, 13 from f16) are dropped, so a bisection over the keys spans 2**(32 - shift)
    values: with the many ties of low-precision logits it otherwise runs to full int32 width
    before the tie cut. Distinct values keep distinct keys and their order."""
    bits = jax.lax.bitcast_convert_type(v, jnp.int32)
    key = jnp.where(v == 0, 0, bits ^ ((bits >> 31) & 0x7FFFFFFF))
    return key >> shift if shift else key


def key_shift(dtype) -> int:
    """Low key bits that are constant for float32 values widened from `dtype` (see `keys`)."""
    return {jnp.dtype(jnp.bfloat16): 16, jnp.dtype(jnp.float16): 13}.get(jnp.dtype(dtype), 0)


def count(mask):
    return jnp.sum(jnp.where(mask, 1, 0))


def superset(key, valid, order, k: int, cap: int, lo=None, n_valid=None):
    """(lo, cut, n): the set valid & (key > lo | key == lo & order < cut) holds the first n
    entries in (key desc, order asc) order, with k <= n <= cap when valid holds >= k entries (all
    of them when it holds <= cap). `order` must be distinct per entry and < 2**31 - 1; `lo`, when
    given, must have at least k valid keys >= it; `n_valid`, when given, is count(valid) (saves a
    reduction). Bisection over the keys, then over the cut when more than `cap` keys tie at the
    k-th largest."""

    def narrow(c):  # invariant: count(>= lo) = c[2] >= k > count(>= hi)
        lo, hi, _ = c
        mid = (lo >> 1) + (hi >> 1) + (lo & hi & 1)  # floor((lo + hi) / 2) without overflow
        n = count(valid & (key >= mid))
        up = n >= k
        return jnp.where(up, mid, lo), jnp.where(up, hi, mid), jnp.where(up, n, c[2])

    def select():
        lo0 = jnp.min(jnp.where(valid, key, INT_MAX)) if lo is None else lo
        hi = jnp.max(jnp.where(valid, key, INT_MIN)) + 1  # nothing is >= hi
        n0 = n_valid if lo is None else count(valid & (key >= lo0))
        lo1, _, n = jax.lax.while_loop(lambda c: (c[2] > cap) & (c[0] < c[1] - 1), narrow,
                                       (lo0, hi, n0))
        above, tie = valid & (key > lo1), valid & (key == lo1)

        def cut_ties(c):  # only when lo1 is the k-th largest: count(cut a) < k < cap < count(b)
            a, b, _ = c
            mid = (a >> 1) + (b >> 1) + (a & b & 1)
            n = count(above | (tie & (order < mid)))
            up = n >= k
            return jnp.where(up, a, mid), jnp.where(up, mid, b), jnp.where(up, n, c[2])

        last = jnp.max(jnp.where(tie, order, -1)) + 1  # cut at `last`: every tie, n entries
        _, cut, n = jax.lax.while_loop(lambda c: c[2] > cap, cut_ties, (0 * last, last, n))
        return lo1, cut, n

    n_valid = count(valid) if n_valid is None else n_valid
    zero = 0 * n_valid  # lo, cut of "all": computed, Pallas:Triton's cond cannot yield literals
    return jax.lax.cond(n_valid > cap, select, lambda: (zero + INT_MIN, zero + INT_MAX, n_valid))


def in_superset(key, valid, order, lo, cut):
    return valid & ((key > lo) | ((key == lo) & (order < cut)))


def exclusive_cumsum(m):
    """Row-major exclusive prefix count of a 1-D or 2-D mask."""
    m = m.astype(jnp.int32)
    flat = m.reshape(-1)
    return (jnp.cumsum(flat) - flat).reshape(m.shape)


def at(pos, mask):
    """Scatter index: pos where mask, else out of range (interpret mode writes masked-off lanes
    back unless their index is out of range, and in-range duplicates would race)."""
    return jnp.where(mask, pos, NOWHERE)


def barrier(interpret: bool) -> None:
    """Make this program's global stores visible to all its threads (a no-op when interpreted:
    the interpreter runs the program's statements in order)."""
    if not interpret:
        plgpu.debug_barrier()
