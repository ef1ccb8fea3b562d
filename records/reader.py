"""Reading a run's records wherever they are (parts, sealed journals, the journal): as dicts, as Arrow batches
in bounded memory, or just the rows asked for (docs/records.md, "Reading").

`RunReader(run_dir)` lists the directory once. `stems()` names its pools' record sets in the order
`load_run` visits them; `records(stem)` yields dicts equal to those written; `batches(stem, columns)` yields
Arrow RecordBatches of REQUEST_SCHEMA (or GENERIC_SCHEMA for stats) a few hundred rows at a time, reading only
the named columns of the parts (a journal's rows are converted on the fly); `turn_io(keys)` and
`prompts(hashes)` fetch the ids of just the rows asked for. What a resume reads is records/resume.py's.
Pass one `seen` set to every call, stems in order, to drop duplicate keys as `load_run` does.
A reader assumes no compaction runs meanwhile (the run directory's lock, records/lock.py, keeps a second
writer out); `load_run` reads again if one moved a file under it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from records import layout as L
from records.columns import from_batch, generic_batch, to_batch
from records.journal import iter_jsonl

BATCH_ROWS = 512


class RunReader:
    """One listing of a run directory's records, read in the order they were written."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.layout = L.scan(self.run_dir / "records")
        self.truncated: list[str] = []  # "file:line" of ignored partial last lines, as sources are read
        self.corrupt: list[str] = []  # "file:line" of skipped unparseable lines
        self.duplicates = 0  # rows dropped because their key was in `seen`
        self._prompts: dict[str, list[int]] | None = None

    def stems(self) -> list[str]:
        """`candidate-<pool>`, `reference`, `stats`, ... that hold records, in load_run's order."""
        return self.layout.stems()

    def _journal(self, path: Path) -> Iterator[dict]:
        for rec, problem, _ in iter_jsonl(path):
            if rec is not None:
                yield rec
            else:
                kind, where = problem.split(":", 1)
                (self.truncated if kind == "truncated" else self.corrupt).append(where)

    def _part(self, path: Path) -> pq.ParquetFile:
        pf = pq.ParquetFile(path)
        meta = pf.metadata.metadata or {}  # the footer's key-value metadata (records/compact.py writes it)
        self.corrupt += json.loads(meta.get(b"specgate.corrupt", b"[]"))
        return pf

    def _keep(self, key, seen: set | None) -> bool:
        if seen is None or key is None:
            return True
        if key in seen:
            self.duplicates += 1
            return False
        seen.add(key)
        return True

    def records(self, stem: str, seen: set | None = None) -> Iterator[dict]:
        """Every record of `stem` as the dict that was written (log-probs at float32), oldest first."""
        request = L.is_request_stem(stem)
        for src in self.layout.sources(stem):
            if src.suffix == L.JOURNAL:
                rows: Iterable[dict] = self._journal(src)
            else:
                rows = (rec for batch in self._part(src).iter_batches(BATCH_ROWS)
                        for rec in (from_batch(batch, self.prompt) if request
                                    else map(json.loads, batch.column("json").to_pylist())))
            for rec in rows:
                if self._keep(rec.get("key"), seen):
                    yield rec

    def batches(self, stem: str, columns: list[str] | None = None, seen: set | None = None
                ) -> Iterator[pa.RecordBatch]:
        """`stem`'s records as Arrow batches of at most BATCH_ROWS rows with `columns` (default all).

        A null `input_ids` means the stored prompt of the row's `input_hash` (`prompts`); `_extra` (JSON) holds
        values that did not fit their column and `_absent` the fields a record lacked (records/columns.py).
        """
        want = columns
        read = None if columns is None else list(dict.fromkeys([*columns, *(["key"] if seen is not None else [])]))
        request = L.is_request_stem(stem)
        for src in self.layout.sources(stem):
            if src.suffix == L.JOURNAL:
                parts = _chunks(self._journal(src))
                source = (to_batch(c, lambda r: True) if request else generic_batch(c) for c in parts)
                source = (b.select(read) if read else b for b in source)
            else:
                source = self._part(src).iter_batches(BATCH_ROWS, columns=read)
            for batch in source:
                if seen is not None:
                    keep = [self._keep(k, seen) for k in batch.column("key").to_pylist()]
                    if not all(keep):
                        batch = batch.filter(pa.array(keep))
                if want is not None and read != want:
                    batch = batch.select(want)
                if batch.num_rows:
                    yield batch

    def prompt(self, input_hash: str) -> list[int]:
        """The stored input ids of `input_hash` (a new list); loads every stored prompt on first use."""
        if self._prompts is None:
            self._prompts = {}
            for path in self.layout.prompt_files():
                t = pq.read_table(path, columns=["input_hash", "input_ids"])
                self._prompts.update(zip(t.column(0).to_pylist(), t.column(1).to_pylist(), strict=True))
        try:
            return list(self._prompts[input_hash])
        except KeyError:
            raise ValueError(f"{self.run_dir / 'records'}: a record's input ids are stored under input_hash "
                             f"{input_hash}, but no prompts.parquet holds it (the run directory is damaged)") from None

    def prompts(self, hashes: Iterable[str]) -> dict[str, list[int]]:
        """The stored input ids of just these hashes, reading prompt files a row group at a time."""
        want = pa.array(sorted(set(hashes)), pa.string())
        out: dict[str, list[int]] = {}
        for path in self.layout.prompt_files() if len(want) else []:
            pf = pq.ParquetFile(path)
            for g in range(pf.num_row_groups):
                mask = pc.is_in(pf.read_row_group(g, columns=["input_hash"]).column(0), value_set=want)
                if pc.any(mask).as_py():
                    t = pf.read_row_group(g, columns=["input_hash", "input_ids"]).filter(mask)
                    out.update(zip(t.column(0).to_pylist(), t.column(1).to_pylist(), strict=True))
        return out

    def turn_io(self, keys: Iterable[str]) -> dict[str, tuple[list[int] | None, list[int] | None]]:
        """(input ids, output ids) of the candidate records with these keys (the first record per key), reading
        whole rows only of the row groups that hold them, and only the prompts they need."""
        want = set(keys)
        found: dict[str, tuple] = {}
        for stem in self.stems():
            if not stem.startswith("candidate-"):
                continue
            for src in self.layout.sources(stem):
                if not want - found.keys():
                    break
                if src.suffix == L.JOURNAL:
                    for rec, _, _ in iter_jsonl(src):
                        if rec is not None and rec.get("key") in want:
                            found.setdefault(rec["key"], (rec.get("input_ids"), rec.get("output_ids")))
                    continue
                pf = pq.ParquetFile(src)
                for g in range(pf.num_row_groups):
                    mask = pc.is_in(pf.read_row_group(g, columns=["key"]).column(0),
                                    value_set=pa.array(sorted(want - found.keys()), pa.string()))
                    if pc.any(mask).as_py():
                        for rec in from_batch(pf.read_row_group(g).filter(mask), _Stored):
                            found.setdefault(rec["key"], (rec.get("input_ids"), rec.get("output_ids")))
        stored = self.prompts(i.input_hash for i, _ in found.values() if isinstance(i, _Stored))
        return {k: (stored[i.input_hash] if isinstance(i, _Stored) else i, o) for k, (i, o) in found.items()}


    def find(self, column: str, values: Iterable[str], role: str) -> dict[str, dict]:
        """The first record of `role` per value of `column` (`key` or `input_hash`) among `values`, as dicts,
        reading whole rows only of the row groups that hold them (a report's worst cases and their references);
        their stored prompts are read in one pass."""
        want = set(values)
        matched: list[list[dict] | pa.Table] = []  # in reading order: a journal's records, a row group's rows
        for stem in self.stems():
            if not L.is_request_stem(stem):
                continue
            for src in self.layout.sources(stem):
                if src.suffix == L.JOURNAL:
                    matched.append([r for r in self._journal(src) if r.get(column) in want])
                else:
                    pf = pq.ParquetFile(src)
                    matched += [t for g in range(pf.num_row_groups)
                                if (t := self._matching(pf, g, column, want, role)) is not None]
        tables = [t for t in matched if isinstance(t, pa.Table)]
        got = self.prompts({h for t in tables for h, null in zip(
            t.column("input_hash").to_pylist(), t.column("input_ids").is_null().to_pylist(), strict=True)
            if null and h is not None})

        def prompt(h: str) -> list[int]:
            return list(got[h]) if h in got else self.prompt(h)  # the latter raises the damaged-run error

        found: dict[str, dict] = {}
        seen: set = set()
        for part in matched:
            for rec in from_batch(part, prompt) if isinstance(part, pa.Table) else part:
                if self._keep(rec.get("key"), seen) and rec.get("role") == role:
                    found.setdefault(rec.get(column), rec)
        return found

    def _matching(self, pf: pq.ParquetFile, g: int, column: str, want: set, role: str) -> pa.Table | None:
        """The rows of row group g whose `column` is in `want` and whose role is `role`, or None."""
        cols = pf.read_row_group(g, columns=[column, "role"])
        mask = pc.and_(pc.is_in(cols.column(0), value_set=pa.array(sorted(want), pa.string())),
                       pc.equal(cols.column(1), role))
        if not pc.any(mask).as_py():
            return None
        return pf.read_row_group(g).filter(mask)


@dataclass(frozen=True)
class _Stored:
    """A row's input ids, to be read from the stored prompts."""

    input_hash: str


def _chunks(records: Iterable[dict], n: int = BATCH_ROWS) -> Iterator[list[dict]]:
    chunk = []
    for rec in records:
        chunk.append(rec)
        if len(chunk) >= n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def raw_records(run_dir: str | Path) -> list[dict]:
    """Every stored record of a run directory, duplicates kept (for checks that count them)."""
    reader = RunReader(run_dir)
    return [rec for stem in reader.stems() for rec in reader.records(stem)]

