"""Reading and writing a run's records: the one writer and the one reader (docs/records.md).

Records are appended one JSON line at a time and flushed, so a killed run loses
at most the line being written. The reader counts a record only once its
newline is on disk, and the writer cuts a partial last line off before it
appends, so a resumed run and its report always agree on what the run holds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


def truncate_partial_line(path: Path) -> int:
    """Cut `path` back to its last complete line; return the number of bytes dropped."""
    if not path.exists():
        return 0
    size = path.stat().st_size
    if size == 0:
        return 0
    with open(path, "rb+") as f:
        f.seek(0)
        data = f.read()
        keep = data.rfind(b"\n") + 1
        if keep < size:
            f.truncate(keep)
    return size - keep


class RecordWriter:
    """Appends records to one JSONL file, one flushed line each; refuses a key twice."""

    def __init__(self, path: Path, existing_keys: set[str] | None = None) -> None:
        truncate_partial_line(path)
        self.path = path
        self.keys = set(existing_keys or ())
        self._f = open(path, "a", encoding="utf-8")

    def write(self, record: dict) -> None:
        key = record["key"]
        if key in self.keys:
            raise AssertionError(f"record key {key} written twice to {self.path.name}")
        self.keys.add(key)
        self._f.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


class RecordFiles:
    """The run's record writers, one file per pool, opened on first use."""

    def __init__(self, run_dir: Path, existing: set[str]) -> None:
        self.dir = run_dir / "records"
        self.dir.mkdir(parents=True, exist_ok=True)
        for path in self.dir.glob("*.jsonl"):
            truncate_partial_line(path)  # before anything is appended after a killed writer's half line
        self.existing = existing
        self._writers: dict[str, RecordWriter] = {}

    def write(self, filename: str, record: dict) -> None:
        w = self._writers.get(filename)
        if w is None:
            w = self._writers[filename] = RecordWriter(self.dir / filename, self.existing)
        w.write(record)

    def close(self) -> None:
        for w in self._writers.values():
            w.close()


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


def read_jsonl(path: Path) -> tuple[list[dict], list[str], list[str]]:
    """Records of one JSONL file, plus the truncated and corrupt line locations it skipped.

    A record counts only once its newline is written: a last line without one is a
    killed writer's partial record and is ignored (the writer cuts it off before
    appending, so resume and report agree on what a run holds). Any other
    unparseable line is skipped too but reported as corrupt, so that one bad byte
    never hides a run.
    """
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    partial = lines.pop()  # after the last newline: "" or a partial record
    truncated_at = len(lines) + 1
    records: list[dict] = []
    truncated: list[str] = []
    corrupt: list[str] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict):
            records.append(obj)
            continue
        corrupt.append(f"{path.name}:{i + 1}")
    if partial.strip():
        truncated.append(f"{path.name}:{truncated_at}")
    return records, truncated, corrupt


def load_run(run_dir: str | Path) -> RunRecords:
    """Read every `records/*.jsonl` of `run_dir` (sorted by name), keep the first record per key."""
    record_dir = Path(run_dir) / "records"
    seen: set[str] = set()
    candidates: list[dict] = []
    references: dict[str, dict] = {}
    stats: list[dict] = []
    truncated: list[str] = []
    corrupt: list[str] = []
    duplicates = 0
    paths = sorted(record_dir.glob("*.jsonl")) if record_dir.is_dir() else []
    for path in paths:
        records, trunc, bad = read_jsonl(path)
        truncated += trunc
        corrupt += bad
        for rec in records:
            key = rec.get("key")
            if key is not None:
                if key in seen:
                    duplicates += 1
                    continue
                seen.add(key)
            if rec.get("role") == "reference":
                references.setdefault(str(rec.get("input_hash")), rec)
            elif rec.get("role") == "candidate":
                candidates.append(rec)
            elif rec.get("role") == "stats":
                stats.append(rec)
    return RunRecords(candidates, references, stats, truncated, corrupt, duplicates)
