"""benchmarks/scale.py's measured children: each reads one synthesized run directory as one part of specgate
does (`python benchmarks/scale.py _hwm _NAME RUN_DIR` runs NAME here and prints its peak RSS)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def has_index() -> bool:
    try:
        from records.reader import RunReader  # noqa: F401
    except ImportError:
        return False
    return True


def jsonl_copy(run_dir: Path, out: Path) -> None:
    """The run directory with its records as journals only: the layout code before parquet parts reads."""
    from records.reader import RunReader

    shutil.rmtree(out, ignore_errors=True)
    (out / "records").mkdir(parents=True)
    shutil.copy(run_dir / "config.json", out / "config.json")
    reader = RunReader(run_dir)
    for stem in reader.stems():
        with open(out / "records" / f"{stem}.jsonl", "w", encoding="utf-8") as f:
            for rec in reader.records(stem):
                f.write(json.dumps(rec, separators=(",", ":")) + "\n")


def has_streamed() -> bool:
    try:
        from reports.analyze_run import analyze_run  # noqa: F401
    except ImportError:
        return False
    return True


def analyze(run_dir: str) -> None:
    """The streamed analyzer (reports/analyze_run.py) and junit.xml from its frame."""
    from reports.analyze_run import analyze_run
    from reports.junit import junit_tree

    got = analyze_run(run_dir)
    assert len(got.df)
    junit_tree(got.df)


def state(run_dir: str) -> None:
    """What a resume keeps with records/resume.py: ResumeState.read (keys and digests, no records)."""
    from records.resume import ResumeState

    state = ResumeState.read(run_dir)
    assert state.candidates and state.references


def resume(run_dir: str) -> None:
    """What harness/run.py's --resume loads: every candidate by key and every reference."""
    from records.jsonl import load_run

    recorded = load_run(run_dir)
    existing, refs = recorded.candidates_by_key(), recorded.references
    assert existing and refs


def scan(run_dir: str) -> None:
    """Every column of every record as Arrow batches, duplicates dropped (what a streaming analyzer reads)."""
    from records.reader import RunReader

    reader, seen, rows = RunReader(run_dir), set(), 0
    for stem in reader.stems():
        for batch in reader.batches(stem, seen=seen):
            rows += batch.num_rows
    assert rows
