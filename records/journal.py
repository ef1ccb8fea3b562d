"""The journal: records appended one JSON line at a time and flushed, the crash-safe append path.

A killed writer loses at most the line being written. The reader counts a record only once its newline
is on disk, and a writer cuts a partial last line off before it appends, so a resumed run and its report
always agree on what the run holds. Journals are compacted into parquet parts (records/compact.py); a
run directory written before that has journals only, and reads the same.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import orjson

_TAIL = 1 << 16  # bytes read per step when looking for the last newline from the end


def truncate_partial_line(path: Path) -> int:
    """Cut `path` back to its last complete line; return the number of bytes dropped.

    Reads backwards from the end only as far as the last newline (a journal can be gigabytes).
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    with open(path, "rb+") as f:
        end = size
        keep = 0
        while end > 0:
            start = max(0, end - _TAIL)
            f.seek(start)
            i = f.read(end - start).rfind(b"\n")
            if i >= 0:
                keep = start + i + 1
                break
            end = start
        if keep < size:
            f.truncate(keep)
    return size - keep


def encode(record: dict) -> bytes:
    """One journal line (newline included): compact JSON in UTF-8 by orjson, which with its check here is 3x
    faster than the standard library on a record with 1,000 top-k log-probs (a driver writes two per candidate
    request). orjson writes a non-finite float as null: a line that does not read back equal to `record` (also
    one with a tuple, which both write as a list) and one orjson refuses (an int beyond 64 bits, a lone
    surrogate, a non-str key) are written by `json`, as before, so every record reads back as it was written,
    NaN and Infinity included."""
    try:
        out = orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)
        if orjson.loads(out) == record:
            return out
    except TypeError:
        pass
    return (json.dumps(record, separators=(",", ":")) + "\n").encode("utf-8")


class RecordWriter:
    """Appends records to one JSONL file, one flushed line each (the caller refuses keys twice)."""

    def __init__(self, path: Path) -> None:
        truncate_partial_line(path)
        self.path = path
        self._f = open(path, "ab")

    def write(self, record: dict) -> None:
        self._f.write(encode(record))
        self._f.flush()

    def close(self, sync: bool = False) -> None:
        """Close the file; `sync`: fsync it first (before it is sealed for compaction)."""
        if sync:
            self._f.flush()
            os.fsync(self._f.fileno())
        self._f.close()


def iter_jsonl(path: Path, name: str | None = None) -> Iterator[tuple[dict | None, str | None, int]]:
    """(record, problem, size) per line of one JSONL file, streamed: problem is None, "corrupt:<name>:<line>"
    (an unparseable or non-object line, skipped) or "truncated:<name>:<line>" (a last line without its
    newline: a killed writer's partial record, ignored); size: the line's bytes. Blank lines are skipped."""
    name = name or path.name
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.endswith(b"\n"):
                if raw.strip():
                    yield None, f"truncated:{name}:{n}", len(raw)
                return
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw.decode("utf-8", errors="replace"))
            except json.JSONDecodeError:
                obj = None
            if isinstance(obj, dict):
                yield obj, None, len(raw)
            else:
                yield None, f"corrupt:{name}:{n}", len(raw)


def read_jsonl(path: Path) -> tuple[list[dict], list[str], list[str]]:
    """Records of one JSONL file, plus the truncated and corrupt line locations ("file:line") it skipped.

    A record counts only once its newline is written: a last line without one is a killed writer's
    partial record and is ignored (the writer cuts it off before appending). Any other unparseable line is
    skipped too but reported as corrupt, so that one bad byte never hides a run.
    """
    records, truncated, corrupt = [], [], []
    for rec, problem, _ in iter_jsonl(path):
        if rec is not None:
            records.append(rec)
        elif problem.startswith("truncated:"):
            truncated.append(problem.split(":", 1)[1])
        else:
            corrupt.append(problem.split(":", 1)[1])
    return records, truncated, corrupt
