"""Argument checks shared by the public entry points: each raises a ValueError naming the argument."""

from __future__ import annotations

import numpy as np


def is_int(value) -> bool:
    """True for a Python or numpy integer; bool is not one."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def check_int(name: str, value, minimum: int) -> None:
    """ValueError naming `name` unless `value` is an int (bool excluded) >= minimum."""
    if not is_int(value) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def integer_array(name: str, value, xp=np):
    """`value` as an `xp` (numpy or jax.numpy) array; ValueError naming `name` unless it holds
    integers: bool and floating values are refused rather than truncated. Works under a trace."""
    array = xp.asarray(value)
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{name} must hold integers, got dtype {array.dtype}")
    return array
