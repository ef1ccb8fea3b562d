"""Small values per row of a streamed analysis, held as flat arrays rather than dicts keyed by row: a dict entry and
its boxed key cost ~100 bytes a row, and a million rows of them pin the allocator's arenas long after.

`RowLengths`: the prefix lengths of some rows (reports/analyze_run.py's index: which prefixes the restore links
compare). `PrefixDigests`: the digests of those prefixes, added by the token pass in row order
(reports/analyze_batch.py), read by the links (reports/links.py `on_path`).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping


class RowLengths:
    """row -> a tuple of lengths (rows ascending, each with its lengths in order)."""

    def __init__(self, rows: Iterable[int] = (), lengths: Iterable[Iterable[int]] = ()) -> None:
        self.rows, self.ends, self.flat = array("q"), array("q"), array("q")
        for row, values in zip(rows, lengths, strict=True):
            assert not self.rows or row > self.rows[-1], (row, self.rows[-1])
            self.rows.append(row)
            self.flat.extend(values)
            self.ends.append(len(self.flat))

    @classmethod
    def of(cls, by_row: Mapping[int, Iterable[int]]) -> RowLengths:
        rows = sorted(by_row)
        return cls(rows, (by_row[r] for r in rows))

    def __len__(self) -> int:
        return len(self.rows)

    def __contains__(self, row: int) -> bool:
        i = bisect_left(self.rows, row)
        return i < len(self.rows) and self.rows[i] == row

    def get(self, row: int) -> tuple[int, ...]:
        """Its lengths (empty: not one of the rows)."""
        i = bisect_left(self.rows, row)
        if i == len(self.rows) or self.rows[i] != row:
            return ()
        return tuple(self.flat[self.ends[i - 1] if i else 0:self.ends[i]])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RowLengths) and (self.rows, self.ends, self.flat) == (other.rows, other.ends,
                                                                                        other.flat)

    __hash__ = None  # type: ignore[assignment]


class PrefixDigests:
    """(row, length) -> a 16-byte digest (length < 0: of the row's first -length input ids; else of its input +
    output ids), added in ascending row order; and the rows that had no input ids."""

    SIZE = 16

    def __init__(self) -> None:
        self.rows, self.lengths, self.data = array("q"), array("q"), bytearray()
        self.no_input: set[int] = set()

    def add(self, row: int, length: int, digest: bytes) -> None:
        assert len(digest) == self.SIZE and (not self.rows or row >= self.rows[-1]), (row, len(digest))
        self.rows.append(row)
        self.lengths.append(length)
        self.data += digest

    def extend(self, other: PrefixDigests) -> None:
        """Append another's (its rows follow this one's)."""
        assert not other.rows or not self.rows or other.rows[0] >= self.rows[-1]
        self.rows.extend(other.rows)
        self.lengths.extend(other.lengths)
        self.data += other.data
        self.no_input |= other.no_input

    def has_input(self, row: int) -> bool:
        """False for a row digested with no input ids (True for every other row)."""
        return row not in self.no_input

    def __getitem__(self, key: tuple[int, int]) -> bytes:
        row, length = key
        for i in range(bisect_left(self.rows, row), bisect_right(self.rows, row)):
            if self.lengths[i] == length:
                return bytes(self.data[i * self.SIZE:(i + 1) * self.SIZE])
        raise KeyError(key)

    def __len__(self) -> int:
        return len(self.rows)

    def clear(self) -> None:
        self.rows, self.lengths, self.data, self.no_input = array("q"), array("q"), bytearray(), set()
