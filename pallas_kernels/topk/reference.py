"""Numpy golden for the "topk" operation."""

from __future__ import annotations

import numpy as np


def topk_reference(x, k: int):
    """x [R, V] -> (values [R, k] descending, indices [R, k] int32); ties -> lower index first."""
    x = np.asarray(x)
    order = np.argsort(-x.astype(np.float64), axis=-1, kind="stable")[:, :k]
    return np.take_along_axis(x, order, -1), order.astype(np.int32)


def logsumexp_reference(x) -> np.ndarray:
    """x [R, V] -> float64 [R] log(sum(exp(x))) (-inf for a row of -inf)."""
    x = np.asarray(x, np.float64)
    m = x.max(-1)
    m_safe = np.where(m == -np.inf, 0.0, m)
    with np.errstate(divide="ignore"):
        return m + np.log(np.exp(x - m_safe[:, None]).sum(-1))
