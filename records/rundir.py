"""Run directories: `runs/<run-id>/{config.json, records/*.jsonl}`, their names and the `runs/latest` link.

Reading and writing the records themselves is records/jsonl.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
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


def create_run_dir(runs_dir: str | Path, run_id: str, latest: bool = True) -> Path:
    """Make `runs_dir/run_id/records` (the run id must be new); with `latest`, point `runs_dir/latest` at it
    (the harness does so only once the run's servers are up, so that a refused run leaves the link alone)."""
    run_dir = Path(runs_dir) / run_id
    if run_dir.exists():
        raise FileExistsError(f"run directory {run_dir} already exists (use --resume {run_dir} to finish it)")
    (run_dir / "records").mkdir(parents=True)
    if latest:
        update_latest(run_dir)
    return run_dir


def discard_if_empty(run_dir: Path, keep: tuple[str, ...] = ("records", "logs")) -> bool:
    """Remove a run directory whose `keep` subdirectories hold no file (a run refused before it recorded or
    logged anything: nothing there to resume or read); True when removed."""
    for sub in keep:
        if any(p.is_file() for p in (run_dir / sub).rglob("*")):
            return False
    shutil.rmtree(run_dir, ignore_errors=True)
    return True


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


def load_config(run_dir: str | Path) -> dict:
    """The run's `config.json`, or `{}` when it is missing or unreadable."""
    path = Path(run_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    return cfg if isinstance(cfg, dict) else {}
