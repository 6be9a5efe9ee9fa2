"""A small byte-level BPE tokenizer for source code, trained offline in pure Python.

Text is split into pre-tokens (a newline with the indentation after it, an identifier or number
with its leading space, a run of punctuation, other whitespace); each pre-token's UTF-8 bytes are
merged by the learned pair ranks. Ids: 0 MASK (the drafter's mask_token_id), 1 BOS, 2 EOS, then
the 256 bytes, then one id per merge. Saved as JSON: {"specials", "merges": [[a, b], ...]}.
"""

from __future__ import annotations

import collections
import heapq
import json
import re
from typing import Iterable

from ddtree_jax.atomic_io import write_json

MASK, BOS, EOS = 0, 1, 2
SPECIALS = ("<|mask|>", "<|bos|>", "<|eos|>")
BYTE0 = len(SPECIALS)
_PRETOKEN = re.compile(r"\n[ \t]*| ?[A-Za-z_][A-Za-z_0-9]*| ?[0-9]+| ?[^\sA-Za-z0-9_]+|[ \t]+|\s")


def pretokens(text: str) -> list[str]:
    return _PRETOKEN.findall(text)


class Tokenizer:
    """encode(text) -> ids (no specials added); decode(ids) -> text (specials dropped)."""

    def __init__(self, merges: Iterable[tuple[int, int]]):
        self.merges = [tuple(m) for m in merges]
        self.ranks = {pair: i for i, pair in enumerate(self.merges)}
        self.pieces = [b""] * BYTE0 + [bytes([b]) for b in range(256)]
        for a, b in self.merges:
            self.pieces.append(self.pieces[a] + self.pieces[b])
        self._cache: dict[str, tuple[int, ...]] = {}

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)

    def _word(self, word: str) -> tuple[int, ...]:
        ids = [BYTE0 + b for b in word.encode("utf-8")]
        while len(ids) > 1:
            ranked = [(self.ranks.get(p, len(self.ranks)), i) for i, p in enumerate(zip(ids, ids[1:]))]
            rank, i = min(ranked)
            if rank == len(self.ranks):
                break
            ids[i:i + 2] = [BYTE0 + 256 + rank]
        return tuple(ids)

    def encode(self, text: str) -> list[int]:
        out = []
        for word in pretokens(text):
            ids = self._cache.get(word)
            if ids is None:
                ids = self._cache[word] = self._word(word)
            out.extend(ids)
        return out

    def decode(self, ids: Iterable[int]) -> str:
        return b"".join(self.pieces[i] for i in ids).decode("utf-8", errors="replace")

    def save(self, path: str) -> None:
        """Write the tokenizer's JSON file atomically."""
        write_json(path, {"type": "byte_bpe", "specials": list(SPECIALS), "byte_offset": BYTE0,
                          "pretoken_regex": _PRETOKEN.pattern, "merges": self.merges})

    @classmethod
    def load(cls, path: str) -> "Tokenizer":
        with open(path) as f:
            d = json.load(f)
        if d.get("specials") != list(SPECIALS) or d.get("pretoken_regex") != _PRETOKEN.pattern:
            raise ValueError(f"{path}: not a tokenizer of this version (specials / pre-token regex differ)")
        return cls(d["merges"])


def train(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Learn `vocab_size - 259` merges from the pre-token counts of `texts` (incremental pair counts)."""
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
    return Tokenizer(merges)
