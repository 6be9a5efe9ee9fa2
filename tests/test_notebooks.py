"""Every notebook in notebooks/ executes on the CPU in small mode (DDTREE_NB_SMALL=1)."""

import glob
import os
import sys

import pytest
from tests import ROOT

# `make test` installs both (the test extra); the GPU machine's image has neither, and a
# `pytest -m gpu tests/` run there must still collect this module.
nbformat = pytest.importorskip("nbformat", reason="nbformat not installed (pip install -e '.[test]')")
NotebookClient = pytest.importorskip("nbclient", reason="nbclient not installed").NotebookClient

NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 3


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_executes_in_small_mode(path, monkeypatch, tmp_path):
    monkeypatch.setenv("DDTREE_NB_SMALL", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    # a fresh sweep into tmp (the notebook's fallback) rather than whatever runs/ holds
    monkeypatch.setenv("DDTREE_SWEEP_JSONL", str(tmp_path / "none.jsonl"))
    # the "python3" kernelspec runs `python`: make it this interpreter
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": os.path.dirname(path)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.output_type == "error"]
    assert not errors
