"""The record keys an analysis pass has met, with the stem each was first met in, in little memory.

RunReader drops a record whose key an earlier record had (records/reader.py `_keep`: `key in seen`, then
`seen.add(key)`). A set of a million keys holds a million Python strings and their entries, ~150 bytes a key,
and those small objects pin the allocator's arenas long after the set is cleared. `SeenKeys` keeps the latest
keys in a dict and moves them, 65,536 at a time, into Arrow text (the keys) and sorted numpy arrays (their
`hash()` and place): a lookup finds the hash by binary search and compares the stored key, so a hash collision
is never taken for a duplicate.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right

import numpy as np
import pyarrow as pa


class SeenKeys:
    """Keys met, each with the stem it was first met in (`stem`: the stem being read now); `earlier[stem]`: the
    keys a stem held that an earlier stem had (RunReader drops them there as duplicates)."""

    BUFFER = 1 << 16
    key_hash = staticmethod(hash)  # the process's own str hash (a test gives one that collides)

    def __init__(self) -> None:
        self.stem = ""
        self.earlier: dict[str, set] = {}
        self._stems: dict[str, int] = {}
        self._names: list[str] = []
        self._recent: dict = {}  # key -> stem number, not yet moved
        self._odd: dict = {}  # keys that are not text (never moved)
        self._chunks: list[pa.Array] = []
        self._starts: list[int] = []  # each chunk's first place
        self._stem_of = array("i")  # place -> stem number
        self._hash = np.zeros(0, np.int64)  # sorted
        self._place = np.zeros(0, np.int64)  # the place of each sorted hash

    def _where(self, key) -> str | None:
        n = self._recent.get(key)
        if n is None:
            n = self._odd.get(key)
        if n is None and isinstance(key, str) and len(self._hash):
            h = self.key_hash(key)
            i = int(np.searchsorted(self._hash, h))
            while i < len(self._hash) and self._hash[i] == h:
                place = int(self._place[i])
                c = bisect_right(self._starts, place) - 1
                if self._chunks[c][place - self._starts[c]].as_py() == key:
                    n = self._stem_of[place]
                    break
                i += 1
        return None if n is None else self._names[n]

    def __contains__(self, key) -> bool:
        where = self._where(key)
        if where is not None and where != self.stem:
            self.earlier.setdefault(self.stem, set()).add(key)
        return where is not None

    def add(self, key) -> None:
        n = self._stems.setdefault(self.stem, len(self._stems))
        if n == len(self._names):
            self._names.append(self.stem)
        if not isinstance(key, str):
            self._odd[key] = n
            return
        self._recent[key] = n
        if len(self._recent) >= self.BUFFER:
            self._move()

    def _move(self) -> None:
        keys = list(self._recent)
        start = len(self._stem_of)
        self._chunks.append(pa.array(keys, pa.string()))
        self._starts.append(start)
        self._stem_of.extend(self._recent.values())
        hashes = np.concatenate([self._hash, np.fromiter(map(self.key_hash, keys), np.int64, len(keys))])
        places = np.concatenate([self._place, np.arange(start, start + len(keys), dtype=np.int64)])
        order = np.argsort(hashes, kind="stable")
        self._hash, self._place = hashes[order], places[order]
        self._recent = {}

    def clear(self) -> None:
        """Forget every key (`earlier` is kept)."""
        self._recent, self._odd, self._chunks, self._starts = {}, {}, [], []
        self._stem_of = array("i")
        self._hash, self._place = np.zeros(0, np.int64), np.zeros(0, np.int64)
