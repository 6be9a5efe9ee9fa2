"""The tokenizer: tokenizers' BPE of the shipped tokenizer.json against the Python golden
(reference/tokenizer_ref.py) and the held-out prompts' ids, transformers' AutoTokenizer on the same
files, the conversion from the earlier format, training, and bad input. Exact equality throughout."""

import hashlib
import json
import os
import re

import numpy as np
import pytest

from ddtree_jax import tokenizer
from ddtree_jax.reference.tokenizer_ref import ByteBPE
from ddtree_jax.training import data
from tests import ROOT

PAIR = os.path.join(ROOT, "assets", "pair")


@pytest.fixture(scope="module")
def shipped():
    return tokenizer.Tokenizer.load(PAIR)


@pytest.fixture(scope="module")
def merges():
    """The shipped tokenizer.json's merges as id pairs [M, 2]."""
    with open(os.path.join(PAIR, tokenizer.TOKENIZER_FILE), encoding="utf-8") as f:
        model = json.load(f)["model"]
    return [[model["vocab"][a], model["vocab"][b]] for a, b in model["merges"]]


@pytest.fixture(scope="module")
def golden(merges):
    return ByteBPE(merges)


@pytest.fixture(scope="module")
def heldout():
    with open(os.path.join(PAIR, "heldout_prompts.json"), encoding="utf-8") as f:
        return json.load(f)["prompts"]


def _legacy_bytes(merges) -> bytes:
    """The earlier format's file of `merges`, byte for byte as its writer made the shipped one
    (json.dump, default separators, no final newline)."""
    obj = {"type": "byte_bpe", "specials": list(tokenizer.SPECIALS), "byte_offset": tokenizer.BYTE0,
           "pretoken_regex": tokenizer.LEGACY_PRETOKEN, "merges": merges}
    return json.dumps(obj).encode()


def _fuzz_texts(rng, n: int) -> list[str]:
    """Strings over code, whitespace runs of every kind, digits, spelled special tokens and random
    code points of every plane (no surrogates), 0-40 pieces each (the empty string included)."""
    pieces = list(" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2007\u200a\u2028\u202f\u3000"
                  "aZ_q019.,;:'\"\\(){}[]<|>-=+*#@$%^&~`!?/\u00e9\u00df\u4e2d\u0301\U0001F600")
    pieces += list(tokenizer.SPECIALS) + ["    ", "\n        ", "\t\t", "  \n", "def ", " return",
                                           "12345", " 3.14", "x_1", "\r\n", "\n\n\n"]
    out = [""]
    for _ in range(n - 1):
        k = int(rng.integers(0, 41))
        parts = []
        for _ in range(k):
            if rng.random() < 0.15:
                c = int(rng.integers(0, 0x110000))
                parts.append(chr(c) if not 0xD800 <= c < 0xE000 else "\ufffd")
            else:
                parts.append(pieces[int(rng.integers(0, len(pieces)))])
        out.append("".join(parts))
    return out


def test_pretoken_whitespace_is_pythons():
    """WHITESPACE names exactly the characters Python's `\\s` matches (all code points)."""
    every = "".join(map(chr, range(0x110000)))
    assert re.findall(f"[{tokenizer.WHITESPACE}]", every) == re.findall(r"\s", every)


def test_shipped_tokenizer_holds_the_merges_the_pair_was_trained_with(merges):
    """The merges rewritten in the earlier format hash to the sha256 of the tokenizer the corpus
    and the held-out prompts were made with (MANIFEST.json)."""
    with open(os.path.join(PAIR, "MANIFEST.json")) as f:
        want = json.load(f)["data"]["tokenizer_sha256"]
    assert hashlib.sha256(_legacy_bytes(merges)).hexdigest() == want
    assert len(merges) == 2048 - 259


def test_heldout_prompts_encode_to_their_ids(shipped, golden, heldout):
    for p in heldout:
        assert shipped.encode(p["text"]) == p["ids"] == golden.encode(p["text"]), p["file"]
        assert shipped.decode(p["ids"]) == p["text"]
    code = data.read("heapq.py")                 # a whole held-out module
    assert shipped.encode(code) == golden.encode(code) and shipped.decode(shipped.encode(code)) == code


def test_encode_and_decode_equal_the_golden_on_fuzzed_text(shipped, golden):
    rng = np.random.default_rng()
    for text in _fuzz_texts(rng, 5000):
        ids = shipped.encode(text)
        assert ids == golden.encode(text), repr(text)
        assert shipped.decode(ids) == text, repr(text)
    for _ in range(5000):        # arbitrary ids: specials, bytes that are not UTF-8, merges
        ids = rng.integers(0, shipped.vocab_size, int(rng.integers(0, 12))).tolist()
        assert shipped.decode(ids) == golden.decode(ids), ids


def test_specials_spelled_in_text_are_text_unless_the_config_says_otherwise(tmp_path, shipped):
    text = "a<|eos|>b"
    assert tokenizer.EOS not in shipped.encode(text)
    shipped.save(tmp_path)
    config = json.loads((tmp_path / tokenizer.CONFIG_FILE).read_text())
    (tmp_path / tokenizer.CONFIG_FILE).write_text(json.dumps(dict(config, split_special_tokens=False)))
    assert tokenizer.EOS in tokenizer.Tokenizer.load(tmp_path).encode(text)
    assert shipped.bos_id == tokenizer.BOS and shipped.eos_id == tokenizer.EOS
    assert shipped.decode([tokenizer.MASK, tokenizer.BOS, tokenizer.EOS]) == ""


def test_autotokenizer_reads_the_pair_and_agrees(shipped, heldout):
    transformers = pytest.importorskip("transformers")
    auto = transformers.AutoTokenizer.from_pretrained(PAIR)
    assert len(auto) == shipped.vocab_size
    assert (auto.bos_token_id, auto.eos_token_id, auto.mask_token_id) == (tokenizer.BOS, tokenizer.EOS,
                                                                          tokenizer.MASK)
    texts = [p["text"] for p in heldout] + _fuzz_texts(np.random.default_rng(), 300)
    for text in texts:
        ids = shipped.encode(text)
        assert auto(text)["input_ids"] == ids, repr(text)
        assert auto.decode(ids, skip_special_tokens=True) == text, repr(text)


def test_convert_legacy_writes_the_shipped_files(tmp_path, merges):
    src = tmp_path / "legacy.json"
    src.write_bytes(_legacy_bytes(merges))
    tokenizer.convert_legacy(src, tmp_path / "out")
    for name in (tokenizer.TOKENIZER_FILE, tokenizer.CONFIG_FILE):
        assert (tmp_path / "out" / name).read_bytes() == open(os.path.join(PAIR, name), "rb").read()
    assert not [n for n in os.listdir(tmp_path / "out") if n.startswith(".tmp-")]
    src.write_text(json.dumps({"type": "byte_bpe", "merges": []}))
    with pytest.raises(ValueError, match="legacy.json: not a byte_bpe tokenizer"):
        tokenizer.convert_legacy(src, tmp_path / "bad")


def test_train_learns_merges_that_round_trip():
    texts = ["def f(x):\n    return x + 1\n", "class A:\n    pass\n\n# caf\u00e9 \u2192 ok\n"] * 3
    tok = tokenizer.train(texts, 300)
    assert 259 < tok.vocab_size <= 300
    merges = json.loads(tok.hf.to_str())["model"]["merges"]
    golden = ByteBPE([[tok.hf.token_to_id(a), tok.hf.token_to_id(b)] for a, b in merges])
    for t in texts + ["unseen \u00fcnicode \U0001F600 text\t\r\n"]:
        assert tok.encode(t) == golden.encode(t)
        assert tok.decode(tok.encode(t)) == t
    assert len(tok.encode(texts[0])) < len(texts[0].encode())


def test_bad_input_names_the_file_or_argument(tmp_path, shipped):
    with pytest.raises(FileNotFoundError, match=f"no tokenizer.json at {tmp_path}"):
        tokenizer.Tokenizer.load(tmp_path)
    (tmp_path / tokenizer.TOKENIZER_FILE).write_text("{}")
    with pytest.raises(ValueError, match="tokenizer.json: not a tokenizers tokenizer.json"):
        tokenizer.Tokenizer.load(tmp_path)
    with pytest.raises(ValueError, match=r"token ids \[2048, -1\] lie outside the vocabulary"):
        shipped.decode([5, 2048, -1])
    with pytest.raises(TypeError, match="text must be a str"):
        shipped.encode([1, 2])
    with pytest.raises(ValueError, match="merge 0 \\[3, 300\\] names an id outside"):
        tokenizer.build([[3, 300]])
