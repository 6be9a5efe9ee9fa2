"""Text <-> token ids through a Hugging Face `tokenizers` tokenizer.json, the one format read here.

`Tokenizer.load(path)` reads tokenizer.json (the file, or a directory holding it: an HF checkpoint,
the shipped pair) and the tokenizer_config.json beside it as transformers' AutoTokenizer reads
them: `split_special_tokens` there makes text that spells a special token encode as plain text.
`encode` adds no special tokens; `decode` drops them.

The shipped pair's tokenizer is a byte-level BPE for source code, learned by `train` and laid out
as tokenizers' BPE model by `build`. Text is split into pre-tokens by PRETOKEN (a newline with the
indentation after it, an identifier or number with its leading space, a run of punctuation, other
whitespace); each pre-token's UTF-8 bytes (as GPT-2's byte-to-character map spells them) are
merged by the learned pair ranks, lowest rank first, leftmost first among equal ranks. Ids: 0 MASK
(the drafter's mask_token_id), 1 BOS, 2 EOS, 3 + b for byte b, then one id per merge.
`convert_legacy` writes tokenizer.json from this package's earlier JSON format (the merges alone).
The tokenizers library is imported on first use, so `import ddtree_jax` works without it.
"""

from __future__ import annotations

import collections
import heapq
import os
import re
from typing import TYPE_CHECKING, Iterable, Sequence

from ddtree_jax.atomic_io import atomic_write, write_json
from ddtree_jax.safetensors_io import read_json

if TYPE_CHECKING:
    import tokenizers

MASK, BOS, EOS = 0, 1, 2
SPECIALS = ("<|mask|>", "<|bos|>", "<|eos|>")
BYTE0 = len(SPECIALS)
TOKENIZER_FILE, CONFIG_FILE = "tokenizer.json", "tokenizer_config.json"

# Python's `\s` (str.isspace), spelled out: tokenizers' regex engine (Oniguruma) reads `\s` as
# Unicode White_Space, which leaves out U+001C-U+001F, so the pattern names every character.
WHITESPACE = (r"\t\n\u000b\u000c\r\u001c-\u001f \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f"
              r"\u205f\u3000")
PRETOKEN = (r"\n[ \t]*| ?[A-Za-z_][A-Za-z_0-9]*| ?[0-9]+| ?[^" + WHITESPACE + r"A-Za-z0-9_]+|[ \t]+|["
            + WHITESPACE + "]")
_PRETOKEN = re.compile(PRETOKEN)
# The earlier JSON format's pattern: the same pre-tokens under Python's re.
LEGACY_PRETOKEN = r"\n[ \t]*| ?[A-Za-z_][A-Za-z_0-9]*| ?[0-9]+| ?[^\sA-Za-z0-9_]+|[ \t]+|\s"


def pretokens(text: str) -> list[str]:
    """The pre-tokens of `text` (PRETOKEN under Python's re); they concatenate to `text`."""
    return _PRETOKEN.findall(text)


def byte_chars() -> list[str]:
    """GPT-2's byte-to-character map, [256]: printable bytes stand for themselves, the others for
    U+0100 onwards, in byte order (tokenizers' ByteLevel)."""
    printable = [*range(0x21, 0x7f), *range(0xa1, 0xad), *range(0xae, 0x100)]
    extra = iter(range(0x100, 0x200))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def _config_token_id(hf: tokenizers.Tokenizer, config: dict, name: str) -> int | None:
    """The id of the token config[name] names (a string, or an AddedToken dict), or None."""
    token = config.get(name)
    if isinstance(token, dict):
        token = token.get("content")
    return hf.token_to_id(token) if isinstance(token, str) else None


class Tokenizer:
    """A tokenizers.Tokenizer (`hf`) and its tokenizer_config.json dict (`config`).

    encode(text) -> ids (no special tokens added); decode(ids) -> text (special tokens dropped,
    a byte sequence that is not UTF-8 replaced by U+FFFD as Python's errors="replace" does).
    """

    def __init__(self, hf: tokenizers.Tokenizer, config: dict | None = None):
        self.hf = hf
        self.config = dict(config or {})
        split = self.config.get("split_special_tokens", False)
        if not isinstance(split, bool):
            raise ValueError(f"{CONFIG_FILE}: split_special_tokens must be a bool, got {split!r}")
        hf.encode_special_tokens = split

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    @property
    def bos_id(self) -> int | None:
        return _config_token_id(self.hf, self.config, "bos_token")

    @property
    def eos_id(self) -> int | None:
        return _config_token_id(self.hf, self.config, "eos_token")

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self.hf.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int]) -> str:
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token ids {bad[:8]} lie outside the vocabulary [0, {self.vocab_size})")
        return self.hf.decode(ids, skip_special_tokens=True)

    def save(self, directory: str | os.PathLike) -> None:
        """Write tokenizer.json and tokenizer_config.json into `directory`, each atomically."""
        directory = os.fspath(directory)
        with atomic_write(os.path.join(directory, TOKENIZER_FILE), encoding="utf-8") as f:
            f.write(self.hf.to_str(pretty=True))
        write_json(os.path.join(directory, CONFIG_FILE), self.config, indent=2)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Tokenizer":
        """From a tokenizer.json file or a directory holding one, with the tokenizer_config.json
        beside it where there is one; FileNotFoundError / ValueError naming the file."""
        path = os.fspath(path)
        file = os.path.join(path, TOKENIZER_FILE) if os.path.isdir(path) else path
        if not os.path.isfile(file):
            raise FileNotFoundError(f"no {TOKENIZER_FILE} at {path}")
        import tokenizers
        try:
            hf = tokenizers.Tokenizer.from_file(file)
        except Exception as e:   # tokenizers raises its own Exception for a malformed file
            raise ValueError(f"{file}: not a tokenizers tokenizer.json: {e}") from None
        config_file = os.path.join(os.path.dirname(file), CONFIG_FILE)
        config = read_json(config_file, CONFIG_FILE, ValueError) if os.path.isfile(config_file) else {}
        return cls(hf, config)


def build(merges: Sequence[Sequence[int]]) -> Tokenizer:
    """The byte-level BPE of `merges` (pairs of ids; merge r makes id BYTE0 + 256 + r) as a
    Tokenizer: vocabulary, merges, PRETOKEN split, byte-level map, the three special tokens."""
    import tokenizers
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    chars = byte_chars()
    pieces = list(SPECIALS) + chars
    for i, pair in enumerate(merges):
        a, b = (int(x) for x in pair)
        if not (BYTE0 <= a < len(pieces) and BYTE0 <= b < len(pieces)):
            raise ValueError(f"merge {i} {list(pair)} names an id outside [{BYTE0}, {len(pieces)})")
        pieces.append(pieces[a] + pieces[b])
    vocab = {p: i for i, p in enumerate(pieces)}
    if len(vocab) != len(pieces):
        raise ValueError("merges make the same byte string twice: not a byte-level BPE")
    hf = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[(pieces[a], pieces[b]) for a, b in merges],
                                         ignore_merges=False))
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKEN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "mask_token": SPECIALS[MASK],
              "bos_token": SPECIALS[BOS], "eos_token": SPECIALS[EOS],
              "clean_up_tokenization_spaces": False, "split_special_tokens": True}
    return Tokenizer(hf, config)


def convert_legacy(src: str | os.PathLike, directory: str | os.PathLike) -> Tokenizer:
    """Read the earlier JSON format ({"type": "byte_bpe", "specials", "pretoken_regex", "merges"})
    at `src` and write its tokenizer.json and tokenizer_config.json into `directory`."""
    src = os.fspath(src)
    d = read_json(src, "tokenizer JSON", ValueError)
    if (d.get("type") != "byte_bpe" or d.get("specials") != list(SPECIALS)
            or d.get("pretoken_regex") != LEGACY_PRETOKEN or not isinstance(d.get("merges"), list)):
        raise ValueError(f"{src}: not a byte_bpe tokenizer of the earlier format (type, specials, "
                         "pretoken_regex or merges differ)")
    tok = build(d["merges"])
    tok.save(directory)
    return tok


def train(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Learn `vocab_size - 259` merges from the pre-token counts of `texts` (incremental pair
    counts; ties go to the smaller pair) -> `build` of them."""
    counts = collections.Counter(w for t in texts for w in pretokens(t))
    words = [[BYTE0 + b for b in w.encode("utf-8")] for w in counts]
    freq = list(counts.values())
    pairs: collections.Counter = collections.Counter()
    where = collections.defaultdict(set)
    for wi, ids in enumerate(words):
        for p in zip(ids, ids[1:]):
            pairs[p] += freq[wi]
            where[p].add(wi)
    heap = [(-c, p) for p, c in pairs.items()]          # lazy max-heap: stale entries are skipped
    heapq.heapify(heap)
    merges = []
    for new in range(BYTE0 + 256, vocab_size):
        while heap and -heap[0][0] != pairs.get(heap[0][1], 0):
            heapq.heappop(heap)
        if not heap or -heap[0][0] < 2:
            break
        best = heapq.heappop(heap)[1]
        merges.append(best)
        touched = set()
        for wi in list(where.pop(best)):
            ids, f = words[wi], freq[wi]
            for p in zip(ids, ids[1:]):
                pairs[p] -= f
                touched.add(p)
            merged, i = [], 0
            while i < len(ids):
                if i + 1 < len(ids) and (ids[i], ids[i + 1]) == best:
                    merged.append(new)
                    i += 2
                else:
                    merged.append(ids[i])
                    i += 1
            words[wi] = merged
            for p in zip(merged, merged[1:]):
                pairs[p] += f
                where[p].add(wi)
                touched.add(p)
        pairs.pop(best, None)
        for p in touched - {best}:
            if pairs[p] > 0:
                heapq.heappush(heap, (-pairs[p], p))
            else:
                del pairs[p]
    return build(merges)
