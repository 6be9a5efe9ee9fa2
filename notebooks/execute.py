"""Execute the notebooks in place, keeping their outputs (figures, tables), so a reader sees them on
the repository page: `make notebooks` (or `python notebooks/execute.py [name.ipynb ...]`).

Each notebook runs in a fresh kernel of this interpreter with matplotlib's inline backend (the
backend a person gets in Jupyter), from the repository root; a cell's error stops it and leaves the
file as it was. `--small` runs the notebooks' quick mode (DDTREE_NB_SMALL=1: what the test suite
runs) and does not write them back.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
NOTEBOOKS = sorted(glob.glob(os.path.join(HERE, "*.ipynb")))


def execute(path: str, *, small: bool = False, env: dict | None = None, timeout: int = 1800):
    """Run the notebook at `path` -> the executed nbformat notebook (not written). env: variables
    set for the kernel besides DDTREE_NB_SMALL (small mode) and MPLBACKEND (removed: inline)."""
    import nbformat
    from nbclient import NotebookClient

    saved = dict(os.environ)
    try:
        os.environ.pop("MPLBACKEND", None)          # the kernel's own default: matplotlib-inline
        os.environ.update(env or {})
        if small:
            os.environ["DDTREE_NB_SMALL"] = "1"
        else:
            os.environ.pop("DDTREE_NB_SMALL", None)
        # the "python3" kernelspec starts `python`: make it this interpreter
        os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
        nb = nbformat.read(path, as_version=4)
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": HERE}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return nb


def figures(nb) -> int:
    """PNG images among the notebook's outputs."""
    return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code"
               for o in c.get("outputs", []))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", help="notebook files (default: every notebook here)")
    ap.add_argument("--small", action="store_true", help="quick mode, not written back")
    args = ap.parse_args(argv)
    import nbformat

    from ddtree_jax.atomic_io import atomic_write
    for path in args.notebooks or NOTEBOOKS:
        nb = execute(path, small=args.small)
        print(f"{os.path.relpath(path)}: {figures(nb)} figure(s)", flush=True)
        if not args.small:
            with atomic_write(path) as f:
                nbformat.write(nb, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
