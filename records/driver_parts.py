"""Driver actors' record journals: `RUN_DIR/drivers/<name>/<stem>.jsonl`, one writer lock each, joined later.

A run with several driver actors (harness/driver_actors.py) gives each actor a directory of its own under
`RUN_DIR/drivers/`, holding its journals under the same names as the run's (`candidate-<pool>.jsonl`,
`reference.jsonl`) and its own `writer.lock` (records/lock.py), so no two writers ever append to one file.
`adopt(run_dir)` joins them into the run's records the way compaction moves its own journals (records/compact.py):
one `records/sealed-<seq>/` per actor directory, its journals renamed into it, built into a part by the next
compaction (or `recover`). Each record is in exactly one place at every instant, so a kill anywhere loses
and doubles nothing; the reader sees an actor's records once they are adopted (at the end of a run, when a
run fails, and first thing on `--resume`).
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from records import layout as L
from records.journal import RecordWriter, truncate_partial_line
from records.lock import LOCK_FILE, RunLock, RunLocked, holder_alive

DRIVERS_DIR = "drivers"


def driver_dir(run_dir: str | Path, name: str) -> Path:
    """The directory of driver actor `name`'s journals."""
    return Path(run_dir) / DRIVERS_DIR / name


class DriverParts:
    """One driver actor's journals (opened on first use) under its own writer lock; refuses a key twice."""

    def __init__(self, run_dir: str | Path, name: str, command: str) -> None:
        self.dir = driver_dir(run_dir, name)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.lock = RunLock.acquire(self.dir, command=command)  # RunLocked: another writer holds these journals
        self.keys: set[str] = set()
        self._writers: dict[str, RecordWriter] = {}

    def write(self, filename: str, record: dict) -> None:
        """Append `record` to this actor's journal `filename` and flush it."""
        key = record["key"]
        if key in self.keys:
            raise AssertionError(f"record key {key} written twice to {self.dir / filename}")
        self.keys.add(key)
        w = self._writers.get(filename)
        if w is None:
            w = self._writers[filename] = RecordWriter(self.dir / filename)
        w.write(record)

    def close(self) -> None:
        """Close (fsync) every journal and release the lock."""
        for w in self._writers.values():
            w.close(sync=True)
        self._writers.clear()
        self.lock.release()


def _free(d: Path, wait_s: float, trust_foreign: bool) -> None:
    """Remove `d`'s writer lock once its holder is gone (waiting up to `wait_s` for it to exit); RunLocked
    when it still runs. `trust_foreign`: a lock held on another host is taken as gone (the caller knows that the
    actors that could hold it are dead: they die with the run process that owned them)."""
    path = d / LOCK_FILE
    deadline = time.monotonic() + wait_s
    while True:
        try:
            holder = json.loads(path.read_bytes())
        except FileNotFoundError:
            return
        except ValueError:
            holder = {}
        foreign = isinstance(holder, dict) and holder.get("host") not in (None, socket.gethostname())
        if not (isinstance(holder, dict) and holder) or (foreign and trust_foreign) or not holder_alive(holder):
            path.unlink(missing_ok=True)
            return
        if time.monotonic() >= deadline:
            raise RunLocked(d, holder)
        time.sleep(0.05)


def adopt(run_dir: str | Path, wait_s: float = 10.0, trust_foreign: bool = True) -> int:
    """Move every driver actor's journals into the run's records as sealed directories (module doc); returns
    the number of records moved. The actors must be stopped: a live holder of a lock is waited for `wait_s`
    seconds, then RunLocked."""
    root = Path(run_dir) / DRIVERS_DIR
    if not root.is_dir():
        return 0
    record_dir = Path(run_dir) / "records"
    moved = 0
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        _free(d, wait_s, trust_foreign)
        journals = []
        for p in sorted(d.glob("*" + L.JOURNAL)):
            truncate_partial_line(p)  # a killed actor's half line is no record
            if p.stat().st_size > 0:
                journals.append(p)
            else:
                p.unlink()
        if not journals:
            _remove_if_empty(d)
            continue
        sealed = L.sealed_dir(record_dir, L.scan(record_dir).next_seq)
        sealed.mkdir()
        L.fsync_dir(record_dir)
        for p in journals:
            with open(p, "rb") as f:
                moved += sum(1 for _ in f)
                os.fsync(f.fileno())
            os.rename(p, sealed / p.name)
        L.fsync_dir(sealed)
        L.fsync_dir(d)
        L.fsync_dir(record_dir)
        _remove_if_empty(d)
    _remove_if_empty(root)
    return moved


def _remove_if_empty(d: Path) -> None:
    try:
        d.rmdir()
    except OSError:  # not empty (what else is there is not ours to remove)
        pass
