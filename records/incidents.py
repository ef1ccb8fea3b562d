"""A run's incidents: replica failures, one JSON line each in `RUN_DIR/incidents.jsonl` (docs/records.md).

An incident is one failure episode of one replica, written when it ends: the
pool and its role, the replica id, the failure that started it, the server's log
file (on the replica's node) and the first lines of its crash, and whether the
replica came back (`recovered`, `recovery_s`) or was given up (`reason`).
Written with the same flushed-line discipline as the records (records/jsonl.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from records.jsonl import read_jsonl, truncate_partial_line

INCIDENTS_FILE = "incidents.jsonl"


class IncidentLog:
    """Appends incidents to `run_dir/incidents.jsonl`, one flushed line each."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / INCIDENTS_FILE
        truncate_partial_line(self.path)

    def write(self, incident: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(incident, separators=(",", ":"), default=str) + "\n")


def load_incidents(run_dir: str | Path) -> list[dict]:
    """Every complete incident of a run, oldest first; [] when there are none."""
    path = Path(run_dir) / INCIDENTS_FILE
    if not path.is_file():
        return []
    return read_jsonl(path)[0]
