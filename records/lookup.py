"""Rows of a run addressed by where they are stored, read again on demand in bounded memory (docs/records.md,
"Reading").

`RowStore(reader)` scans a stem's records as Arrow batches like `RunReader.batches`, and gives with each batch
where each row lives: (source, row group, row). A part's row groups are read back from the part; a journal
(no random access) is converted once and, when the scan is asked to `spill`, each of its chunks is written as
a row group of a temporary parquet file that later reads use. `take(wheres, columns)` returns those rows,
reading each row group once and keeping the most recently used ones up to `budget` bytes. `prompt_index()`
says where each stored prompt is, `prompt_ids(wheres)` reads them.
"""

from __future__ import annotations

import tempfile
from collections import OrderedDict
from collections.abc import Iterator, MutableMapping
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from records import layout as L
from records.columns import REQUEST_SCHEMA, to_batch
from records.reader import BATCH_ROWS, RunReader, _chunks

Where = tuple[int, int, int]  # (source, row group, row)
OPEN_FILES = 64  # parquet sources kept open at once


class RowStore:
    """Request rows of one run directory by location, with a byte-bounded cache of row groups."""

    def __init__(self, reader: RunReader, budget: int = 64 << 20) -> None:
        self.reader = reader
        self.budget = budget
        self.sources: list[Path] = []  # parquet files rows are read back from (parts, spills, prompt files)
        self._ids: dict[Path, int] = {}
        self._cache: OrderedDict[tuple, pa.Table] = OrderedDict()
        self._cached = 0
        self._spill: tempfile.TemporaryDirectory | None = None
        self._files: OrderedDict[int, pq.ParquetFile] = OrderedDict()  # open sources, the OPEN_FILES last used

    def adopt(self, sources: list[Path]) -> None:
        """Number `sources` as another RowStore numbered them (this one has none yet), so that its row places
        (`Where`) address the same rows here."""
        assert not self.sources, "adopt before any scan"
        for path in sources:
            self._source(path)

    def _source(self, path: Path) -> int:
        if path not in self._ids:
            self._ids[path] = len(self.sources)
            self.sources.append(path)
        return self._ids[path]

    def scan(self, stem: str, columns: list[str], seen: set | None = None, spill_role: str | None = None
             ) -> Iterator[tuple[pa.RecordBatch, int, int, np.ndarray]]:
        """(batch of `columns`, source, row group, rows) per stored batch of a request stem, duplicate keys
        dropped through `seen` as RunReader.batches drops them; `rows`: each kept row's index in its group.
        `spill_role`: make a journal's chunks that hold a record of this role readable by `take` (a journal
        chunk not spilled has source -1)."""
        read = list(dict.fromkeys([*columns, "key"]))
        for src in self.reader.layout.sources(stem):
            if src.suffix == L.JOURNAL:
                yield from self._journal(src, read, columns, seen, spill_role)
                continue
            pf = self.reader._part(src)
            s = self._source(src)
            for g in range(pf.num_row_groups):
                yield self._kept(pf.read_row_group(g, columns=read), read, columns, seen, s, g)

    def _kept(self, table, read, columns, seen, s, g):
        batch = table.combine_chunks().to_batches()[0] if table.num_rows else pa.RecordBatch.from_pylist(
            [], schema=pa.schema([REQUEST_SCHEMA.field(c) for c in read]))
        rows = np.arange(batch.num_rows)
        if seen is not None:
            keep = np.array([self.reader._keep(k, seen) for k in batch.column("key").to_pylist()], dtype=bool)
            if not keep.all():
                batch, rows = batch.filter(pa.array(keep)), rows[keep]
        return batch.select(columns), s, g, rows

    def _journal(self, src: Path, read, columns, seen, spill_role):
        writer, s, groups = None, -1, 0
        try:
            for chunk in _chunks(self.reader._journal(src), BATCH_ROWS):
                full = to_batch(chunk, lambda r: True)
                where = (-1, -1)
                if spill_role is not None and any(r.get("role") == spill_role for r in chunk):
                    if writer is None:
                        if self._spill is None:
                            self._spill = tempfile.TemporaryDirectory(prefix="specgate-spill-")
                        path = Path(self._spill.name) / f"{len(self.sources)}.parquet"
                        writer, s = pq.ParquetWriter(path, REQUEST_SCHEMA), self._source(path)
                    writer.write_batch(full, row_group_size=len(chunk))
                    where, groups = (s, groups), groups + 1
                yield self._kept(pa.Table.from_batches([full.select(read)]), read, columns, seen, *where)
        finally:
            if writer is not None:
                writer.close()

    def _group(self, s: int, g: int, columns: tuple[str, ...]) -> pa.Table:
        key = (s, g, columns)
        table = self._cache.get(key)
        if table is not None:
            self._cache.move_to_end(key)
            return table
        pf = self._files.get(s)
        if pf is None:
            pf = self._files[s] = pq.ParquetFile(self.sources[s])
            if len(self._files) > OPEN_FILES:  # a soak run has thousands of parts: neither their footers nor
                self._files.popitem(last=False)[1].close()  # file handles may grow with it
        else:
            self._files.move_to_end(s)
        table = pf.read_row_group(g, columns=list(columns))
        self._cache[key] = table
        self._cached += table.nbytes
        while self._cached > self.budget and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._cached -= old.nbytes
        return table

    def take(self, wheres: list[Where], columns: list[str]) -> pa.Table:
        """The rows at `wheres`, in that order, with `columns` (a part's or a spilled journal's rows only)."""
        cols = tuple(columns)
        if not wheres:
            return pa.Table.from_batches([], schema=pa.schema([REQUEST_SCHEMA.field(c) for c in cols]))
        order: dict[tuple[int, int], list[int]] = {}
        for n, (s, g, _) in enumerate(wheres):
            order.setdefault((s, g), []).append(n)
        pieces, positions = [], []
        for (s, g), ns in order.items():
            rows = np.array([wheres[n][2] for n in ns], dtype=np.int64)
            group = self._group(s, g, cols)
            if len(rows) and (np.diff(rows) == 1).all():  # a run of consecutive rows: a zero-copy slice
                pieces.append(group.slice(int(rows[0]), len(rows)))
            else:
                pieces.append(group.take(pa.array(rows)))
            positions += ns
        table = pa.concat_tables(pieces) if len(pieces) > 1 else pieces[0]
        if positions != sorted(positions):
            inverse = np.empty(len(positions), dtype=np.int64)
            inverse[np.array(positions)] = np.arange(len(positions))
            table = table.take(pa.array(inverse))
        return table.combine_chunks()

    def prompt_index(self, into: MutableMapping | None = None) -> MutableMapping:
        """input_hash -> where its stored prompt is (a later prompt file wins, as RunReader.prompt reads them),
        put into `into` (a dict by default)."""
        out = into if into is not None else {}
        for path in self.reader.layout.prompt_files():
            s, pf = self._source(path), pq.ParquetFile(path)
            for g in range(pf.num_row_groups):
                hashes = pf.read_row_group(g, columns=["input_hash"]).column(0).to_pylist()
                for r, h in enumerate(hashes):
                    out[h] = (s, g, r)
        return out

    def prompt_ids(self, wheres: list[Where]) -> pa.Array:
        """The stored input ids at `wheres` (list<int32>), in that order."""
        if not wheres:
            return pa.array([], pa.list_(pa.int32()))
        return self.take(wheres, ["input_ids"]).column(0).combine_chunks()

    def close(self) -> None:
        """Drop the cache and remove spilled journals."""
        self._cache.clear()
        self._files.clear()
        self._cached = 0
        if self._spill is not None:
            self._spill.cleanup()
            self._spill = None
