"""Helpers shared by the benchmark entry points in experiments/: timing and markdown tables."""

from __future__ import annotations

import time
from typing import Callable, Sequence

import jax
import numpy as np


def median_seconds(fn: Callable, *args, reps: int, inner: int = 1) -> float:
    """Median over `reps` rounds of the seconds per call of fn(*args), after one untimed call
    (compile, warm-up). A round dispatches `inner` calls back to back and waits for the last
    result once, so with inner > 1 the host's dispatch overlaps the device's work."""
    if reps < 1 or inner < 1:
        raise ValueError(f"reps and inner must be >= 1, got reps={reps}, inner={inner}")
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            out = fn(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / inner)
    return float(np.median(times))


def markdown_table(rows: Sequence[dict], cols: Sequence[str], headers: Sequence[str] | None = None) -> str:
    """Rows (dicts) as a markdown table of columns `cols` (floats to 3 significant digits)."""
    fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else "" if v is None else str(v)
    out = ["| " + " | ".join(headers or cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(out)
