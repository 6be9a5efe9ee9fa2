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


INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def integer_array(name: str, value, xp=np):
    """`value` as an `xp` (numpy or jax.numpy) array; ValueError naming `name` unless it holds
    integers that fit int32, the width the engine computes in: bool and floating values are
    refused rather than truncated, and larger values rather than wrapped. Works under a trace
    (where the range is not known and not checked)."""
    dtype = getattr(value, "dtype", None)
    if dtype is not None and (np.issubdtype(dtype, np.signedinteger) and np.dtype(dtype).itemsize <= 4
                              or np.issubdtype(dtype, np.unsignedinteger) and np.dtype(dtype).itemsize <= 2):
        host = None                         # fits int32 by its type: no copy to the host
    else:
        try:
            host = np.asarray(value)        # concrete: lists, numpy and jax arrays
        except Exception:                   # a traced value
            host = None
    if host is not None and host.dtype == object and host.size and all(is_int(v) for v in host.flat):
        raise ValueError(f"{name} must lie in int32's range [{INT32_MIN}, {INT32_MAX}]; got values "
                         f"up to {max(abs(int(v)) for v in host.flat)} in magnitude")
    if host is not None and np.issubdtype(host.dtype, np.integer) and host.size and (
            host.min() < INT32_MIN or host.max() > INT32_MAX):
        raise ValueError(f"{name} must lie in int32's range [{INT32_MIN}, {INT32_MAX}]; got "
                         f"[{host.min()}, {host.max()}]")
    array = xp.asarray(value) if host is None or xp is not np else host
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{name} must hold integers, got dtype {array.dtype}")
    return array
