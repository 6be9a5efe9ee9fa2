"""Figures drawn without pyplot: `matplotlib.figure.Figure` objects, which neither pick nor switch a
matplotlib backend, so the same code writes PNGs headless and shows inline in Jupyter (a returned
figure displays as a cell's value, or with IPython's `display`). matplotlib is the [plots] extra."""

from __future__ import annotations

import os

from ddtree_jax.atomic_io import atomic_path


def new_figure(path: str | os.PathLike | None = None, **kw):
    """A matplotlib Figure (kw as Figure's: figsize, dpi, layout, ...), or None with a printed note
    naming `path` when matplotlib is not installed."""
    try:
        import matplotlib  # noqa: F401  (first: a missing package fails here, not midway)
        from matplotlib.figure import Figure
    except ImportError:
        print(f"matplotlib is not installed (pip install -e '.[plots]')"
              + (f": {path} not written" if path else ""), flush=True)
        return None
    return Figure(**kw)


def save_png(fig, path: str | os.PathLike, dpi: int = 110) -> None:
    """Write `fig` as a PNG at `path` atomically."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi, format="png")
