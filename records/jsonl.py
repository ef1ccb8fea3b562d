"""The one writer and the one reader of a run's records (docs/records.md).

`RecordFiles` appends records to one journal per pool (records/journal.py: one flushed JSON line each, so a
kill loses only what was in flight) and compacts the journals into a parquet part (records/compact.py) when
told (`compact()`, e.g. at a sweep point's end), at `close()`, and when it opens a run directory that holds
journals (a resume). `load_run` reads every record of a run directory, wherever it is (parts, sealed or
live journals; a run written before parts existed has journals only), as dicts; records/reader.py reads them
as Arrow batches in bounded memory.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from records import layout as L
from records.compact import Hook, PromptStore, build, recover, seal
from records.journal import RecordWriter, read_jsonl, truncate_partial_line
from records.reader import RunReader

__all__ = ["RecordFiles", "RecordWriter", "RunRecords", "load_run", "read_jsonl", "truncate_partial_line"]


def _nohook(step: str) -> None:
    pass


class RecordFiles:
    """The run's record writers, one journal per pool (opened on first use); refuses a key twice.

    `existing`: the keys already recorded (a resume's), refused too. `compact_on_open`: compact the journals
    a killed run left (after cutting a partial last line) before anything is appended. Safe to call
    `compact` from another thread than `write` (asyncio.to_thread): journals are sealed under a lock, the
    part is built outside it while new records go to fresh journals.
    """

    def __init__(self, run_dir: Path, existing: set[str], compact_on_open: bool = True) -> None:
        self.dir = Path(run_dir) / "records"
        self.dir.mkdir(parents=True, exist_ok=True)
        for path in L.scan(self.dir).journals.values():
            truncate_partial_line(path)  # before anything is appended after a killed writer's half line
        self.keys = set(existing)
        self._writers: dict[str, RecordWriter] = {}
        self._lock = threading.Lock()  # write() against compact()'s sealing
        self._compacting = threading.Lock()  # one compaction at a time
        self.store = PromptStore(self.dir)
        recover(self.dir, self.store)  # a compaction killed last time: finish it first
        if compact_on_open:
            self.compact()

    def write(self, filename: str, record: dict) -> None:
        """Append `record` to journal `filename` (e.g. candidate-i128.jsonl) and flush it."""
        key = record["key"]
        with self._lock:
            if key in self.keys:
                raise AssertionError(f"record key {key} written twice to {filename}")
            self.keys.add(key)
            w = self._writers.get(filename)
            if w is None:
                w = self._writers[filename] = RecordWriter(self.dir / filename)
            w.write(record)

    def compact(self, hook: Hook = _nohook) -> Path | None:
        """Move every journal's records into a new parquet part; returns it (None: nothing to compact)."""
        with self._compacting:
            recover(self.dir, self.store, hook)
            with self._lock:
                for w in self._writers.values():
                    w.close(sync=True)
                self._writers.clear()
                sealed = seal(self.dir, hook=hook)
            return build(self.dir, *sealed, self.store, hook) if sealed else None

    def close(self) -> None:
        """Compact, then close. A failed compaction (disk full) leaves every record where the reader finds it,
        and the next open of the run directory finishes it; it is reported, not raised."""
        try:
            self.compact()
        except OSError as e:
            print(f"specgate: warning: compacting the records of {self.dir} failed ({e}); they are kept in their "
                  "journals and compacted when the run directory is next opened", file=sys.stderr)
        finally:
            with self._lock:
                for w in self._writers.values():
                    w.close()
                self._writers.clear()


@dataclass(frozen=True)
class RunRecords:
    """Every record of a run, deduplicated by `key`, candidates apart from references."""

    candidates: list[dict]
    references: dict[str, dict]  # input_hash -> reference record (first one seen)
    stats: list[dict] = field(default_factory=list)  # per sweep point and replica: cache counters (role "stats")
    truncated: list[str] = field(default_factory=list)  # "file:line" of ignored truncated last lines
    corrupt: list[str] = field(default_factory=list)  # "file:line" of unparseable lines elsewhere
    duplicates: int = 0  # records dropped because their key was already seen

    @property
    def empty(self) -> bool:
        return not self.candidates and not self.references

    def candidates_by_key(self) -> dict[str, dict]:
        """The candidate records by key: what a resumed run must not send again."""
        return {c["key"]: c for c in self.candidates if c.get("key") is not None}


def _load(run_dir: Path) -> RunRecords:
    reader = RunReader(run_dir)
    seen: set = set()
    candidates: list[dict] = []
    references: dict[str, dict] = {}
    stats: list[dict] = []
    for stem in reader.stems():
        for rec in reader.records(stem, seen):
            role = rec.get("role")
            if role == "reference":
                references.setdefault(str(rec.get("input_hash")), rec)
            elif role == "candidate":
                candidates.append(rec)
            elif role == "stats":
                stats.append(rec)
    return RunRecords(candidates, references, stats, reader.truncated, reader.corrupt, reader.duplicates)


def load_run(run_dir: str | Path) -> RunRecords:
    """Every record of `run_dir` (pools in journal-name order, each in write order), the first per key."""
    for attempt in range(3):
        try:
            return _load(Path(run_dir))
        except FileNotFoundError:  # a compaction (another process) moved a file while it was read: read again
            if attempt == 2:
                raise
    raise AssertionError("unreachable")
