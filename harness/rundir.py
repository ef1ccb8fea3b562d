"""Run directories: `runs/<run-id>/{config.json, records/*.jsonl}` and the `runs/latest` link.

Records are appended one JSON line at a time and flushed, so a killed run loses
at most the line being written; reopening a file for a resume first cuts it
back to its last complete line.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from pathlib import Path

REFERENCE_FILE = "reference.jsonl"


def input_hash(input_ids: list[int] | tuple[int, ...]) -> str:
    """sha256 (first 16 hex chars) of the input ids as a JSON list: the candidate/reference join key."""
    return hashlib.sha256(json.dumps(list(input_ids)).encode()).hexdigest()[:16]


def new_run_id() -> str:
    """A sortable, unique run id: UTC time plus 4 random hex chars."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)


def candidate_file(pool: str) -> str:
    return f"candidate-{pool}.jsonl"


def create_run_dir(runs_dir: str | Path, run_id: str) -> Path:
    """Make `runs_dir/run_id/records` (the run id must be new) and point `runs_dir/latest` at it."""
    run_dir = Path(runs_dir) / run_id
    if run_dir.exists():
        raise FileExistsError(f"run directory {run_dir} already exists (use --resume {run_dir} to finish it)")
    (run_dir / "records").mkdir(parents=True)
    update_latest(run_dir)
    return run_dir


def update_latest(run_dir: Path) -> None:
    """Atomically point `<runs_dir>/latest` at `run_dir` (a relative symlink)."""
    link = run_dir.parent / "latest"
    tmp = run_dir.parent / f".latest-{os.getpid()}"
    try:
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(run_dir.name)
        os.replace(tmp, link)
    except OSError:
        tmp.unlink(missing_ok=True)  # a filesystem without symlinks: the run itself is fine


def write_json(path: Path, obj: dict) -> None:
    """Write `obj` as indented JSON via a temporary file, so a reader never sees half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)


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


def read_records(path: Path) -> list[dict]:
    """The complete records of one JSONL file (a truncated last line is ignored)."""
    if not path.exists():
        return []
    out = []
    data = path.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]
    for line in complete.splitlines():
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and "key" in obj:
            out.append(obj)
    return out


def read_run_records(run_dir: Path) -> tuple[dict[str, dict], dict[str, dict]]:
    """Existing `(candidates by key, references by input_hash)` of a run directory."""
    candidates: dict[str, dict] = {}
    references: dict[str, dict] = {}
    for path in sorted((run_dir / "records").glob("*.jsonl")):
        for rec in read_records(path):
            if rec.get("role") == "reference":
                references.setdefault(rec["input_hash"], rec)
            else:
                candidates.setdefault(rec["key"], rec)
    return candidates, references


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
