"""The byte-level BPE of `ddtree_jax.tokenizer`, written out in Python: the golden for the
tokenizers library's encoder and decoder.

Pre-tokens by Python's re with `\\s` (tokenizer.LEGACY_PRETOKEN, not the spelled-out PRETOKEN the
tokenizers model runs); each pre-token's UTF-8 bytes start as ids BYTE0 + b, and the adjacent pair
of the lowest merge rank (the leftmost among equal ranks) is merged until no pair has a rank.
Decoding joins the ids' bytes and decodes them as UTF-8 with errors="replace"; special ids are
empty.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

from ddtree_jax.tokenizer import BYTE0, LEGACY_PRETOKEN

_PRETOKEN = re.compile(LEGACY_PRETOKEN)


class ByteBPE:
    """encode(text) -> ids; decode(ids) -> text, from merges [M, 2] (merge r makes id BYTE0 + 256 + r)."""

    def __init__(self, merges: Sequence[Sequence[int]]):
        self.ranks = {(int(a), int(b)): r for r, (a, b) in enumerate(merges)}
        self.pieces = [b""] * BYTE0 + [bytes([b]) for b in range(256)]
        for a, b in merges:
            self.pieces.append(self.pieces[a] + self.pieces[b])

    def _word(self, word: str) -> list[int]:
        ids = [BYTE0 + b for b in word.encode("utf-8")]
        none = len(self.ranks)
        while len(ids) > 1:
            rank, i = min((self.ranks.get(p, none), i) for i, p in enumerate(zip(ids, ids[1:])))
            if rank == none:
                break
            ids[i:i + 2] = [BYTE0 + 256 + rank]
        return ids

    def encode(self, text: str) -> list[int]:
        return [i for word in _PRETOKEN.findall(text) for i in self._word(word)]

    def decode(self, ids: Iterable[int]) -> str:
        return b"".join(self.pieces[i] for i in ids).decode("utf-8", errors="replace")
