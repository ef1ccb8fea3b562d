"""Text keys of a million records mapped to small integers, in little memory: the keys an analysis pass has met
(`SeenKeys`) and where each reference and stored prompt is (`KeyMap(3)`: source, row group, row).

A dict of a million keys holds a million Python strings and their entries, ~150 bytes a key, and those small
objects pin the allocator's arenas long after the dict is gone. `KeyMap` keeps the latest keys in a dict and
moves them, 65,536 at a time, into Arrow text (the keys), a flat integer array (their values) and sorted numpy
arrays (their `hash()` and place): a lookup finds the hash by binary search and compares the stored key, so a
hash collision is never taken for the key. A map loaded in another process (a Ray task's view of the run)
hashes its keys again there: `hash()` of a string is salted per process.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right

import numpy as np
import pyarrow as pa


class KeyMap:
    """key -> a tuple of `width` integers (dict semantics: `get`, `in`, `[key]`, `[key] = value`, `setdefault`);
    a key that is not text is kept in a plain dict."""

    BUFFER = 1 << 16
    key_hash = staticmethod(hash)  # the process's own str hash (a test gives one that collides)

    def __init__(self, width: int) -> None:
        self.width = width
        self.clear()

    def clear(self) -> None:
        self._recent: dict = {}  # key -> value, not yet moved
        self._odd: dict = {}  # keys that are not text (never moved)
        self._chunks: list[pa.Array] = []
        self._starts: list[int] = []  # each chunk's first place
        self._values = array("q")  # `width` per place
        self._hash = np.zeros(0, np.int64)  # sorted
        self._place = np.zeros(0, np.int64)  # the place of each sorted hash

    def __len__(self) -> int:
        return len(self._values) // self.width + len(self._recent) + len(self._odd)

    def _find(self, key: str) -> int | None:
        """The moved key's place."""
        if not len(self._hash):
            return None
        h = self.key_hash(key)
        i = int(np.searchsorted(self._hash, h))
        while i < len(self._hash) and self._hash[i] == h:
            place = int(self._place[i])
            c = bisect_right(self._starts, place) - 1
            if self._chunks[c][place - self._starts[c]].as_py() == key:
                return place
            i += 1
        return None

    def get(self, key, default=None):
        if not isinstance(key, str):
            return self._odd.get(key, default)
        value = self._recent.get(key)
        if value is not None:
            return value
        place = self._find(key)
        return default if place is None else tuple(self._values[place * self.width:(place + 1) * self.width])

    def __contains__(self, key) -> bool:
        return self.get(key) is not None

    def __getitem__(self, key) -> tuple[int, ...]:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __setitem__(self, key, value) -> None:
        value = tuple(int(v) for v in value)
        assert len(value) == self.width, value
        if not isinstance(key, str):
            self._odd[key] = value
        elif key in self._recent or (place := self._find(key)) is None:
            self._recent[key] = value
            if len(self._recent) >= self.BUFFER:
                self._move()
        else:
            self._values[place * self.width:(place + 1) * self.width] = array("q", value)

    def setdefault(self, key, value) -> tuple[int, ...]:
        have = self.get(key)
        if have is None:
            self[key] = value
            return self.get(key)
        return have

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        del state["_hash"], state["_place"]  # str hashes are salted per process: made again where it is loaded
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        hashes = [np.fromiter(map(self.key_hash, c.to_pylist()), np.int64, len(c)) for c in self._chunks]
        self._hash = np.concatenate(hashes) if hashes else np.zeros(0, np.int64)
        order = np.argsort(self._hash, kind="stable")
        self._hash, self._place = self._hash[order], order.astype(np.int64)

    def _move(self) -> None:
        keys = list(self._recent)
        start = len(self._values) // self.width
        self._chunks.append(pa.array(keys, pa.string()))
        self._starts.append(start)
        for value in self._recent.values():
            self._values.extend(value)
        hashes = np.concatenate([self._hash, np.fromiter(map(self.key_hash, keys), np.int64, len(keys))])
        places = np.concatenate([self._place, np.arange(start, start + len(keys), dtype=np.int64)])
        order = np.argsort(hashes, kind="stable")
        self._hash, self._place = hashes[order], places[order]
        self._recent = {}


class SeenKeys:
    """Keys met, each with the stem it was first met in (`stem`: the stem being read now); `earlier[stem]`: the
    keys a stem held that an earlier stem had (RunReader drops them there as duplicates). The protocol of a set
    for records/reader.py `_keep`: `key in seen`, then `seen.add(key)`."""

    def __init__(self, keys: KeyMap | None = None) -> None:
        self.stem = ""
        self.earlier: dict[str, set] = {}
        self._keys = keys if keys is not None else KeyMap(1)  # key -> (stem number,)
        self._stems: dict[str, int] = {}
        self._names: list[str] = []

    def __contains__(self, key) -> bool:
        n = self._keys.get(key)
        where = None if n is None else self._names[n[0]]
        if where is not None and where != self.stem:
            self.earlier.setdefault(self.stem, set()).add(key)
        return where is not None

    def add(self, key) -> None:
        n = self._stems.setdefault(self.stem, len(self._stems))
        if n == len(self._names):
            self._names.append(self.stem)
        self._keys.setdefault(key, (n,))

    def clear(self) -> None:
        """Forget every key (`earlier` is kept)."""
        self._keys.clear()
