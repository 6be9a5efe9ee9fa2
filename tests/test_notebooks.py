"""Every notebook in notebooks/ executes on the CPU in small mode (DDTREE_NB_SMALL=1) with
matplotlib's inline backend, as in Jupyter, and shows figures."""

import importlib.util
import os

import pytest

from tests import ROOT

# `make test` installs both (the test extra); the GPU machine's image has neither, and a
# `pytest -m gpu tests/` run there must still collect this module.
pytest.importorskip("nbformat", reason="nbformat not installed (pip install -e '.[test]')")
pytest.importorskip("nbclient", reason="nbclient not installed")

_spec = importlib.util.spec_from_file_location("notebooks_execute", os.path.join(ROOT, "notebooks", "execute.py"))
execute = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(execute)


def test_there_are_notebooks():
    assert len(execute.NOTEBOOKS) >= 3


@pytest.mark.parametrize("path", execute.NOTEBOOKS, ids=os.path.basename)
def test_notebook_executes_inline_and_shows_figures(path, tmp_path):
    # a fresh sweep into tmp (the notebook's fallback) rather than whatever runs/ holds
    nb = execute.execute(path, small=True, env={"DDTREE_SWEEP_JSONL": str(tmp_path / "none.jsonl")},
                         timeout=300)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.output_type == "error"]
    assert not errors
    assert execute.figures(nb) >= 1, "no figure shown inline"


def test_committed_notebooks_hold_their_figures():
    """The notebooks are committed executed (`make notebooks`): a reader sees the figures."""
    import nbformat
    for path in execute.NOTEBOOKS:
        assert execute.figures(nbformat.read(path, as_version=4)) >= 1, f"{path}: no figures committed"
