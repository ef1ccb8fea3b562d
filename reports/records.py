"""Load a run directory's records (docs/records.md) and split them by role."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class RunRecords:
    """Every record of a run, deduplicated by `key`, candidates apart from references."""

    candidates: list[dict]
    references: dict[str, dict]  # input_hash -> reference record (first one seen)
    truncated: list[str] = field(default_factory=list)  # "file:line" of ignored truncated last lines
    corrupt: list[str] = field(default_factory=list)  # "file:line" of unparseable lines elsewhere
    duplicates: int = 0  # records dropped because their key was already seen

    @property
    def empty(self) -> bool:
        return not self.candidates and not self.references


def read_jsonl(path: Path) -> tuple[list[dict], list[str], list[str]]:
    """Records of one JSONL file, plus the truncated and corrupt line locations it skipped.

    A last line that does not parse and has no trailing newline is a killed
    writer's partial record: it is ignored. Any other unparseable line is
    skipped too but reported as corrupt, so that one bad byte never hides a run.
    """
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    ends_with_newline = text.endswith("\n")
    if ends_with_newline:
        lines = lines[:-1]  # the empty string after the final newline
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
        where = f"{path.name}:{i + 1}"
        is_last = i == len(lines) - 1
        (truncated if is_last and not ends_with_newline else corrupt).append(where)
    return records, truncated, corrupt


def load_run(run_dir: str | Path) -> RunRecords:
    """Read every `records/*.jsonl` of `run_dir` (sorted by name), keep the first record per key."""
    record_dir = Path(run_dir) / "records"
    seen: set[str] = set()
    candidates: list[dict] = []
    references: dict[str, dict] = {}
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
    return RunRecords(candidates, references, truncated, corrupt, duplicates)


def load_config(run_dir: str | Path) -> dict:
    """The run's `config.json`, or `{}` when it is missing or unreadable."""
    path = Path(run_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    return cfg if isinstance(cfg, dict) else {}
