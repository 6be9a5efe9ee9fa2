"""experiments/retap_drafter.py and ship_pair.py from the command line: the re-tap of a drafter on a
small corpus cache, and a re-tap of another drafter than the manifest's refused before any decode."""

import json
import os
import shutil

import numpy as np

from ddtree_jax.checkpoint import load_target
from ddtree_jax.drafter_io import load_drafter
from ddtree_jax.pair import SHIPPED
from ddtree_jax.training import data
from tests import ROOT, run_python


def _corpus_cache(path) -> str:
    """A corpus cache build_corpus accepts for the shipped tokenizer: 4,096 random ids."""
    tok = os.path.join(SHIPPED, "tokenizer.json")
    meta = {"tokenizer_sha256": data.file_sha256(tok), "max_files": 0}
    tokens = np.random.default_rng(0).integers(3, 2048, 4096).astype(np.uint16)
    np.savez(path, tokens=tokens, meta=json.dumps(meta))
    return str(path)


def test_retap_drafter_folds_the_median_rms_into_the_last_taps_rows(tmp_path):
    out = run_python([os.path.join(ROOT, "experiments", "retap_drafter.py"),
                      f"--corpus_cache={_corpus_cache(tmp_path / 'corpus.npz')}", "--windows=4",
                      "--seq_len=32", f"--out={tmp_path / 'drafter'}", f"--workdir={tmp_path / 'work'}",
                      "--dtype=float32"])
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "work" / "summary.json").read_text())
    assert summary["source_drafter_sha256"] == data.file_sha256(os.path.join(SHIPPED, "drafter", "model.safetensors"))
    assert summary["command"].startswith("python ") and summary["windows"] == 4
    dcfg, before = load_drafter(os.path.join(SHIPPED, "drafter"), dtype=np.float32)
    _, after = load_drafter(tmp_path / "drafter", dtype=np.float32)
    tcfg, tparams = load_target(os.path.join(SHIPPED, "target"), dtype=np.float32)
    d, k = dcfg.hidden_size, dcfg.target_layer_ids.index(tcfg.num_hidden_layers - 1)
    rows = slice(k * d, (k + 1) * d)
    scale = summary["median_rms"] / np.asarray(tparams["norm"]["scale"], np.float64)
    np.testing.assert_allclose(np.asarray(after["fc"]["kernel"])[rows],
                               np.asarray(before["fc"]["kernel"], np.float64)[rows] * scale[:, None], rtol=1e-6)
    others = np.ones(len(dcfg.target_layer_ids) * d, bool)
    others[rows] = False
    assert np.array_equal(np.asarray(after["fc"]["kernel"])[others], np.asarray(before["fc"]["kernel"])[others])


def test_ship_pair_refuses_a_retap_of_another_drafter(tmp_path):
    pair = tmp_path / "pair"
    shutil.copytree(SHIPPED, pair)
    (tmp_path / "retap").mkdir()
    (tmp_path / "retap" / "summary.json").write_text(json.dumps(
        {"command": "python experiments/retap_drafter.py", "source_drafter_sha256": "0" * 64, "median_rms": 3.0}))
    out = run_python([os.path.join(ROOT, "experiments", "ship_pair.py"), f"--pair_dir={pair}",
                      "--target_workdir=", "--drafter_workdir=", f"--retap_workdir={tmp_path / 'retap'}"])
    assert out.returncode != 0 and "other than the one the manifest lists" in out.stderr, out.stderr[-2000:]
    assert (pair / "MANIFEST.json").read_text() == open(os.path.join(SHIPPED, "MANIFEST.json")).read()
