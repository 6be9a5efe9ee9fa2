"""Training: the held-out split, the batched drafter forward, and both training runs (recipes: few
steps, resume)."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

# A core dependency, so `make test` has it; the GPU machine's image does not, and a
# `pytest -m gpu tests/` run there must still collect this module.
pytest.importorskip("ml_collections", reason="ml_collections not installed (pip install -e .)")

from ddtree_jax import tokenizer
from ddtree_jax.reference import model_ref
from ddtree_jax.training import data, recipes, retap, trainer
from ddtree_jax.checkpoint import load_target, save_target_hf
from ddtree_jax.config import DrafterConfig, ModelConfig
from ddtree_jax.drafter import drafter_hidden, init_drafter
from ddtree_jax.drafter_io import load_drafter
from ddtree_jax.model import init_target
from configs import train_drafter_small, train_target_small
from pallas_kernels import moe
from tests import ROOT

TOKENIZER = os.path.join(ROOT, "assets", "pair", "tokenizer.json")


def test_heldout_files_are_not_trained_on():
    assert not set(data.HELDOUT) & set(data.training_files())
    assert set(data.HELDOUT) <= set(data.stdlib_files())


def test_batched_drafter_forward_equals_drafter_hidden():
    tcfg = ModelConfig.preset("tiny")
    dcfg = DrafterConfig.for_target(tcfg, num_hidden_layers=2, block_size=4)
    params = init_drafter(dcfg, jax.random.key(0))
    k1, k2 = jax.random.split(jax.random.key(1))
    t, d = 12, tcfg.hidden_size
    taps = jax.random.normal(k1, (1, t, len(dcfg.target_layer_ids) * d))
    anchors = jnp.array([[3, 8]], jnp.int32)
    emb = jax.random.normal(k2, (1, 2, dcfg.block_size, d))
    got = trainer.drafter_train_hidden(params, dcfg, taps, emb, anchors)
    reference = jax.jit(drafter_hidden, static_argnums=1)
    for j, a in enumerate(np.asarray(anchors[0])):
        pos = jnp.concatenate([jnp.arange(a), a + jnp.arange(dcfg.block_size)])[None]
        want = reference(params, dcfg, taps[:, :a], emb[:, j], pos)
        np.testing.assert_allclose(got[0, j], want[0], atol=2e-5, rtol=2e-5)


def test_drafter_loss_rejects_unknown_labels():
    with pytest.raises(ValueError, match="labels"):
        trainer.drafter_loss(None, None, None, None, None, None, 4, 7.0, labels="soft")


def test_sample_anchors_fit_the_sequence():
    a = np.asarray(trainer.sample_anchors(jax.random.key(0), 4, 40, 16, 10))
    assert a.shape == (4, 10) and a.min() >= 1 and a.max() <= 40 - 16
    assert all(len(set(row)) == 10 for row in a)


@pytest.fixture
def compile_cache(tmp_path):
    """A persistent compilation cache, so the resumed run does not compile again."""
    keys = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
            "jax_persistent_cache_min_entry_size_bytes")
    old = {k: getattr(jax.config, k) for k in keys}
    for k, v in zip(keys, (str(tmp_path / "jax_cache"), 0.0, 0)):
        jax.config.update(k, v)
    yield
    for k, v in old.items():
        jax.config.update(k, v)


def test_distilled_continuations_are_the_targets_greedy_tokens(tmp_path):
    tcfg = ModelConfig.preset("tiny", vocab_size=2048)
    tparams = init_target(tcfg, jax.random.key(3))
    prompts = np.random.default_rng(0).integers(3, 2048, size=(3, 5))
    seqs = trainer.greedy_continuations((tcfg, tparams), prompts, new_tokens=4, streams=2)
    assert seqs.shape == (3, 9) and np.array_equal(seqs[:, :5], prompts)
    _, greedy = trainer.target_taps(tparams, tcfg, jnp.asarray(seqs), (1,))
    np.testing.assert_array_equal(np.asarray(greedy)[:, 4:8], seqs[:, 5:9])  # float32: exact
    path = str(tmp_path / "d.npz")
    np.savez(path, tokens=seqs.astype(np.uint16), meta='{"command": "x"}')
    rows, meta = data.load_sequences(path)
    batch = data.sample_rows(rows, 4, 6, seed=0, step=1)
    assert batch.shape == (4, 6) and meta["command"] == "x"
    assert all(any(np.array_equal(b, r[o:o + 6]) for r in seqs for o in range(4)) for b in batch)
    with pytest.raises(ValueError, match="seq_len"):
        data.sample_rows(rows, 1, 10, seed=0, step=0)


def test_sample_batch_reaches_the_last_window():
    tokens = np.arange(10, dtype=np.uint16)
    whole = data.sample_batch(tokens, 3, 10, seed=0, step=0)      # exactly one window fits
    np.testing.assert_array_equal(whole, np.tile(np.arange(10), (3, 1)))
    starts = {int(b[0]) for step in range(50) for b in data.sample_batch(tokens, 8, 7, seed=1, step=step)}
    assert starts == {0, 1, 2, 3}
    with pytest.raises(ValueError, match="fewer than seq_len 11"):
        data.sample_batch(tokens, 1, 11, seed=0, step=0)


def test_train_drafter_on_distilled_rows(tmp_path):
    tcfg = ModelConfig.preset("tiny", vocab_size=2048)
    target = str(tmp_path / "target")
    save_target_hf(target, tcfg, init_target(tcfg, jax.random.key(0)))
    path = str(tmp_path / "d.npz")
    rows = np.random.default_rng(1).integers(3, 2048, size=(4, 40)).astype(np.uint16)
    np.savez(path, tokens=rows, meta='{"command": "python experiments/distill_data.py"}')
    d = _small(train_drafter_small.get_config(), tmp_path, target=target, steps=1, anchors_per_seq=2,
               num_hidden_layers=1, target_layer_ids=(), distill_data=path)
    summary = recipes.train_drafter(d, str(tmp_path / "drafter"))
    assert summary["steps"] == 1 and summary["data"]["command"].endswith("distill_data.py")


def test_train_drafter_fine_tunes_an_exported_drafter(tmp_path):
    tcfg = ModelConfig.preset("tiny", vocab_size=2048)
    target = str(tmp_path / "target")
    save_target_hf(target, tcfg, init_target(tcfg, jax.random.key(0)))
    kw = dict(target=target, steps=1, anchors_per_seq=2, num_hidden_layers=1, target_layer_ids=(),
              distill_data="")
    first = str(tmp_path / "first")
    recipes.train_drafter(_small(train_drafter_small.get_config(), tmp_path, **kw), str(tmp_path / "w1"),
                        first)
    # lr 0: the fine-tuned export must be the starting drafter, bit for bit
    c = _small(train_drafter_small.get_config(), tmp_path, init_from=first, lr=0.0, weight_decay=0.0, **kw)
    summary = recipes.train_drafter(c, str(tmp_path / "w2"), str(tmp_path / "second"))
    assert summary["init"]["sha256"] == data.file_sha256(os.path.join(first, "model.safetensors"))
    (_, a), (_, b) = (load_drafter(str(tmp_path / n), dtype=jnp.float32) for n in ("first", "second"))
    jax.tree.map(np.testing.assert_array_equal, a, b)
    c = _small(train_drafter_small.get_config(), tmp_path, init_from=first,
               **(kw | {"num_hidden_layers": 2}))
    with pytest.raises(ValueError, match=r"init_from .*num_hidden_layers \(1 there, 2 here\)"):
        recipes.train_drafter(c, str(tmp_path / "w3"))


def _small(cfg, tmp_path, **kw):
    cfg.tokenizer = TOKENIZER
    cfg.corpus_cache = str(tmp_path / "corpus.npz")
    cfg.corpus_max_files = 3
    cfg.update(dict(time_budget_s=0.0, seq_len=32, batch_size=2, log_every=1, ckpt_every=2, warmup=1), **kw)
    return cfg


def test_train_target_resumes_and_exports(tmp_path, capsys, compile_cache, monkeypatch):
    c = _small(train_target_small.get_config(), tmp_path, preset="tiny", steps=1)
    work, export = str(tmp_path / "target"), str(tmp_path / "export")
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "matplotlib", None)      # no [plots] extra: the export still happens
        first = recipes.train_target(c, work, export)
    assert first["steps"] == 1 and np.isfinite(first["final_loss"])
    assert "loss.png not written" in capsys.readouterr().out
    assert not os.path.exists(os.path.join(work, "loss.png"))
    assert os.path.isfile(os.path.join(work, "summary.json")) and load_target(export)[0].vocab_size == 2048
    c.steps = 2
    second = recipes.train_target(c, work, export)
    assert "resumed from" in capsys.readouterr().out and second["steps"] == 2
    assert os.path.isfile(os.path.join(work, "loss.png"))
    cfg, params = load_target(export, dtype=jnp.float32)
    assert cfg.vocab_size == 2048 and params["lm_head"]["kernel"].shape == (cfg.hidden_size, 2048)


def test_train_drafter_on_a_framework_target(tmp_path):
    tcfg = ModelConfig.preset("tiny", vocab_size=2048)
    target = str(tmp_path / "target")
    save_target_hf(target, tcfg, init_target(tcfg, jax.random.key(0)))
    d = _small(train_drafter_small.get_config(), tmp_path, target=target, steps=2, anchors_per_seq=3,
               num_hidden_layers=1, target_layer_ids=(), labels="target", distill_data="")
    summary = recipes.train_drafter(d, str(tmp_path / "drafter"), str(tmp_path / "export"))
    assert summary["steps"] == 2 and np.isfinite(summary["final_loss"])
    assert len(summary["slot_accuracy"]) == d.block_size - 1
    assert os.path.isfile(str(tmp_path / "drafter" / "loss.png"))
    dcfg, _ = load_drafter(str(tmp_path / "export"), dtype=jnp.float32)
    assert dcfg.block_size == 16 and dcfg.mask_token_id == tokenizer.MASK


def test_raw_last_layer_rms_equals_the_golden():
    """The golden of an (L+1)-layer copy taps layer L-1 before any final norm: its raw output."""
    cfg = ModelConfig.preset("tiny")
    params, experts = model_ref.random_params(cfg, np.random.default_rng(5))
    last = cfg.num_hidden_layers - 1
    jparams = jax.tree_util.tree_map(jnp.asarray, params)
    for i, e in experts.items():
        jparams[f"layers_{i}"]["mlp"]["experts"] = moe.prepare_experts_bf16(e["gate"], e["up"], e["down"])
    longer = cfg.replace(num_hidden_layers=cfg.num_hidden_layers + 1)
    extended = {**params, f"layers_{last + 1}": params[f"layers_{last}"]}
    tokens = np.random.default_rng(6).integers(0, cfg.vocab_size, (2, 7))
    _, _, h = model_ref.decoder_forward(extended, longer, tokens, taps=(last,),
                                        experts_hf={**experts, last + 1: experts[last]})
    want = np.sqrt(np.mean(h * h, axis=-1))
    got = retap.raw_last_layer_rms(jparams, cfg, tokens)
    np.testing.assert_allclose(got, want, rtol=1e-4)


def test_fold_final_norm_gives_the_raw_tap_context_at_the_folded_rms():
    """fc(concat(tap 1, h)) of the raw-tap drafter equals fc(concat(tap 1, w * h / rms(h))) of the
    folded one when rms(h) is the folded rms; other taps' rows and every other leaf unchanged."""
    tcfg = ModelConfig.preset("tiny")
    tparams = init_target(tcfg, jax.random.key(0))
    tparams = {**tparams, "norm": {"scale": jnp.asarray(np.random.default_rng(1).uniform(0.5, 2.0, tcfg.hidden_size),
                                                        jnp.float32)}}
    last = tcfg.num_hidden_layers - 1
    dcfg = DrafterConfig.for_target(tcfg, target_layer_ids=(0, last))
    dparams = init_drafter(dcfg, jax.random.key(2))
    folded = retap.fold_final_norm(dcfg, dparams, tcfg, tparams, 3.0)
    rng = np.random.default_rng(3)
    h = rng.standard_normal((5, tcfg.hidden_size))
    h *= 3.0 / np.sqrt(np.mean(h * h, axis=-1, keepdims=True))          # rms exactly 3
    tap0, w = rng.standard_normal((5, tcfg.hidden_size)), np.asarray(tparams["norm"]["scale"], np.float64)
    normed = w * h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + tcfg.rms_norm_eps)
    raw_ctx = np.concatenate([tap0, h], -1) @ np.asarray(dparams["fc"]["kernel"], np.float64)
    new_ctx = np.concatenate([tap0, normed], -1) @ np.asarray(folded["fc"]["kernel"], np.float64)
    np.testing.assert_allclose(new_ctx, raw_ctx, rtol=1e-5, atol=1e-5)
    d = tcfg.hidden_size
    assert np.array_equal(folded["fc"]["kernel"][:d], dparams["fc"]["kernel"][:d])
    assert all(folded[k] is dparams[k] for k in dparams if k != "fc")
    with pytest.raises(ValueError, match="not the target's last layer"):
        retap.fold_final_norm(DrafterConfig.for_target(tcfg, target_layer_ids=(0,)),
                              init_drafter(DrafterConfig.for_target(tcfg, target_layer_ids=(0,)), jax.random.key(4)),
                              tcfg, tparams, 3.0)
    with pytest.raises(ValueError, match="positive finite"):
        retap.fold_final_norm(dcfg, dparams, tcfg, tparams, float("nan"))
