"""Text in and out on the shipped pair (float32, CPU): generate and serve take strings, return
texts and latency fields; the command line; where load_pair finds the tokenizer."""

import json
import os
import shutil

import jax.numpy as jnp
import pytest

import ddtree_jax as dj
from ddtree_jax import cli, pair as pair_mod, tokenizer
from tests import ROOT

PROMPTS = ["def add(a, b):\n    return", "import os\n\n\nclass Path"]


@pytest.fixture(scope="module")
def shipped():
    return dj.load_pair(pair_mod.SHIPPED, jnp.float32)


def test_generate_takes_text_and_returns_texts(shipped):
    target, drafter, tok = shipped
    ids = [tok.encode(PROMPTS[0]), tok.encode(PROMPTS[1])]
    by_ids = dj.generate(target, drafter, ids, method="ddtree", budget=8, max_new_tokens=8, stage_reps=0)
    by_text = dj.generate(target, drafter, [PROMPTS[0], ids[1]], method="ddtree", budget=8,
                          max_new_tokens=8, stage_reps=0, tokenizer=tok)
    assert by_text.tokens == by_ids.tokens and by_ids.texts is None
    assert by_text.texts == [tok.decode(t) for t in by_text.tokens]
    assert all(len(t) == 8 for t in by_text.tokens)
    assert by_text.first_token_seconds == [by_text.prefill_seconds] * 2
    assert all(f < last <= by_text.prefill_seconds + by_text.decode_seconds * 1.0001
               for f, last in zip(by_text.first_token_seconds, by_text.last_token_seconds))
    m = by_text.metrics()
    assert by_text.nodes_per_step == 9 and by_text.max_accept_length == drafter[0].block_size
    assert m["mean_accept_length"] == pytest.approx(by_text.tau, rel=1e-12)
    assert sum(m["acceptance_histogram"]) == sum(len(a) for a in by_text.acceptance_lengths)
    assert len(m["acceptance_rate_by_depth"]) == drafter[0].block_size - 1
    assert m["ttft_seconds"]["p50"] == pytest.approx(by_text.prefill_seconds)
    assert m["tpot_seconds"]["p99"] > 0 and m["tokens_per_second"] == by_text.tokens_per_second
    with pytest.raises(ValueError, match=r"prompts\[1\] is text: pass tokenizer="):
        dj.generate(target, drafter, [ids[0], PROMPTS[1]], max_new_tokens=2)
    with pytest.raises(ValueError, match="got one str: pass \\[text\\]"):
        dj.generate(target, drafter, PROMPTS[0], max_new_tokens=2, tokenizer=tok)
    with pytest.raises(ValueError, match=r"prompts\[0\] is text that encodes to no tokens"):
        dj.generate(target, drafter, [""], max_new_tokens=2, tokenizer=tok)


def test_serve_takes_text_and_times_each_request(shipped):
    target, drafter, tok = shipped
    prompts = PROMPTS + ["x = [1, 2, 3]\nfor"]
    out = dj.serve(target, None, prompts, streams=2, method="ar", max_new_tokens=[6, 3, 5], tokenizer=tok)
    ref = dj.generate(target, None, [tok.encode(p) for p in prompts], method="ar",
                      max_new_tokens=[6, 3, 5], stage_reps=0)
    assert out.tokens == ref.tokens and out.texts == [tok.decode(t) for t in ref.tokens]
    first, last = out.first_token_seconds, out.last_token_seconds
    assert first[:2] == [out.prefill_seconds] * 2 and first[2] > out.prefill_seconds
    assert all(f <= x <= out.prefill_seconds + out.decode_seconds for f, x in zip(first, last))
    m = out.metrics()
    assert m["acceptance_histogram"] == [0, sum(len(t) - 1 for t in out.tokens)]
    assert m["accepted_per_verified"] == 1.0 and m["acceptance_rate_by_depth"] == []
    assert m["ttft_seconds"]["p99"] <= max(first) and m["tpot_seconds"]["mean"] > 0


def test_command_line_prints_text_and_figures(shipped, capsys):
    target, _, tok = shipped
    assert cli.main(["def add(a, b):", "--method=ar", "--max_new_tokens=5", "--dtype=float32",
                     "--no_stop", "--metrics"]) == 0
    out, err = capsys.readouterr()
    text, figures = out.rsplit("\n", 2)[:2]
    want = dj.generate(target, None, ["def add(a, b):"], method="ar", max_new_tokens=5, stage_reps=0,
                       tokenizer=tok)
    assert text == want.texts[0]
    assert json.loads(figures)["acceptance_histogram"] == [0, 4]
    assert err.startswith("ar: 5 tokens in 4 steps, tau 1.00, ") and "tokens/s" in err
    with pytest.raises(SystemExit):
        cli.main(["x", "--method=beam"])


def test_load_pair_prefers_the_checkpoint_tokenizer_and_checks_its_vocabulary(tmp_path):
    small = tokenizer.train(["def f(x):\n    return x\n"] * 4, 280)
    target = tmp_path / "pair" / "target"
    shutil.copytree(os.path.join(pair_mod.SHIPPED, "target"), target)
    shutil.copy(os.path.join(pair_mod.SHIPPED, "tokenizer.json"), tmp_path / "pair")
    assert pair_mod.find_tokenizer(target, tmp_path / "pair").vocab_size == 2048
    small.save(target)
    assert pair_mod.find_tokenizer(target, tmp_path / "pair").vocab_size == small.vocab_size
    assert pair_mod.find_tokenizer(tmp_path) is None
    # a 64-id target with the shipped 2048-id tokenizer
    bad = tmp_path / "bad"
    shutil.copytree(os.path.join(ROOT, "tests", "fixtures", "hf_deepseek_v3"), bad / "target")
    (bad / "drafter").mkdir()
    shutil.copy(os.path.join(pair_mod.SHIPPED, "tokenizer.json"), bad)
    with pytest.raises(ValueError, match="the tokenizer has 2048 ids, more than the target's vocab_size 64"):
        dj.load_pair(bad, jnp.float32)
    with pytest.raises(FileNotFoundError, match="drafter not found: a pair directory holds"):
        dj.load_pair(tmp_path / "pair", jnp.float32)


def test_manifest_record_is_the_training_summary_and_checks_the_files(tmp_path):
    record = pair_mod.manifest_record(pair_mod.SHIPPED, "target")
    with open(os.path.join(pair_mod.SHIPPED, "MANIFEST.json")) as f:
        manifest = json.load(f)
    assert f"python {record['command']}" in manifest["commands"]
    assert "train_target.py" in record["command"] and record["data"] == manifest["data"]
    assert record["steps"] == manifest["training"]["target"]["steps"] > 0
    copy = tmp_path / "pair"
    shutil.copytree(pair_mod.SHIPPED, copy)
    with open(copy / "target" / "config.json", "a") as f:
        f.write("\n")
    with pytest.raises(ValueError, match=r"target/config\.json is not the file"):
        pair_mod.manifest_record(copy, "target")
    assert pair_mod.manifest_record(copy, "target", unchecked=("target/config.json",)) == record
    drafter = pair_mod.manifest_record(copy, "drafter")
    assert "train_drafter.py" in drafter["command"] and drafter["data"] == manifest["distill_data"]
    assert drafter["retap"]["command"] in manifest["commands"]
    assert drafter["retap"]["median_rms"] == manifest["training"]["drafter_retap"]["median_rms"]
    with pytest.raises(ValueError, match="'target' or 'drafter'"):
        pair_mod.manifest_record(copy, "tokenizer")
