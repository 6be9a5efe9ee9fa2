"""Argument checks shared by the operations' entry points."""

from __future__ import annotations

import jax
import numpy as np


def concrete(x) -> np.ndarray | None:
    """x's values when they are known now (not traced under jit), else None: range checks on
    index arrays run eagerly and are skipped inside a trace."""
    try:
        return np.asarray(x)
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
        return None
