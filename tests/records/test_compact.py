"""A compaction killed at any step loses and doubles nothing, and the next open finishes it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from records import compact
from records.jsonl import RecordFiles, load_run
from records.reader import raw_records
from tests.reports.factory import candidate, prompt, reference

REPO = Path(__file__).resolve().parents[2]


class Killed(BaseException):
    """What the hook raises: not an Exception, so nothing on the way cleans up (as after kill -9)."""


def records(start: int, n: int) -> list[tuple[str, dict]]:
    out = []
    for i in range(start, start + n):
        ids = prompt(30 + i, seed=i)
        out.append(("candidate-i128.jsonl", candidate(ids, [i, i + 1], pool="i128", session_id=f"s{i}")))
        out.append(("reference.jsonl", reference(ids, [i, i + 1])))
    out.append(("stats.jsonl", {"key": f"stats/i128-c{start}/r0", "role": "stats", "run_id": "t", "counters": {}}))
    return out


def killed_run(run_dir: Path) -> None:
    """A run that compacted once, then wrote more records and was killed (no close)."""
    files = RecordFiles(run_dir, set())
    for name, rec in records(0, 3):
        files.write(name, rec)
    files.compact()
    for name, rec in records(3, 5):
        files.write(name, rec)
    del files


def state(run_dir: Path) -> tuple:
    run = load_run(run_dir)
    assert (run.truncated, run.corrupt, run.duplicates) == ([], [], 0)
    return run.candidates, run.references, run.stats


def steps(run_dir: Path) -> list[str]:
    """Every hook point of the compaction a resume does on `killed_run`'s directory."""
    seen: list[str] = []
    compact.compact_run(run_dir, seen.append)
    return seen


def kill_at(step: int):
    calls = iter(range(10**6))

    def hook(name: str) -> None:
        if next(calls) == step:
            raise Killed(name)
    return hook


def leftovers(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "records").iterdir() if not p.name.startswith("part-"))


@pytest.fixture(autouse=True)
def small_batches(monkeypatch):
    monkeypatch.setattr(compact, "BATCH_ROWS", 2)  # several row groups per file: kills inside a file too


def test_the_compaction_has_the_documented_steps(tmp_path):
    killed_run(tmp_path)
    got = steps(tmp_path)
    assert got[:5] == ["seal:mkdir", "seal:candidate-i128.jsonl", "seal:reference.jsonl", "seal:stats.jsonl",
                       "build:start"]
    assert got[5:-6] == ["build:candidate-i128:batch0", "build:candidate-i128:batch1", "build:candidate-i128:batch2",
                         "build:reference:batch0", "build:reference:batch1", "build:reference:batch2",
                         "build:stats:batch0"]
    assert got[-6:] == ["build:fsync", "commit", "clean:candidate-i128.jsonl", "clean:reference.jsonl",
                        "clean:stats.jsonl", "clean:rmdir"]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> tuple[Path, list[str], tuple]:
    """A killed run's directory (copied for each kill), the steps of its compaction, and what it holds."""
    d = tmp_path_factory.mktemp("prepared")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(compact, "BATCH_ROWS", 2)
        killed_run(d)
        want = state(d)
        shutil.copytree(d, d.with_name("probe"))
        names = steps(d.with_name("probe"))
    return d, names, want


def copy_of(prepared, tmp_path: Path, name: str) -> Path:
    d = tmp_path / name
    shutil.copytree(prepared[0], d)
    return d


def test_a_kill_at_any_step_loses_and_doubles_nothing(prepared, tmp_path):
    _, names, want = prepared
    for i, name in enumerate(names):
        d = copy_of(prepared, tmp_path, f"k{i}")
        with pytest.raises(Killed):
            compact.compact_run(d, kill_at(i))
        assert state(d) == want, f"killed before {name}"
        assert len(raw_records(d)) == sum(map(len, want)), f"killed before {name}: a record stored twice"
        files = RecordFiles(d, set())  # a resume: recovers, compacts
        assert state(d) == want and leftovers(d) == [], f"resumed after a kill before {name}"
        files.close()


@pytest.mark.parametrize("first", ["seal:reference.jsonl", "build:reference:batch1", "clean:reference.jsonl"])
def test_a_kill_at_any_step_of_the_recovery_loses_and_doubles_nothing(prepared, tmp_path, first):
    """Killed while sealing, while building, after the commit; then the recovery killed at each of its steps."""
    _, names, want = prepared
    probe = copy_of(prepared, tmp_path, "probe")
    with pytest.raises(Killed):
        compact.compact_run(probe, kill_at(names.index(first)))
    recovery: list[str] = []
    compact.compact_run(probe, recovery.append)
    assert recovery, "the recovery has steps to kill"
    for j, name in enumerate(recovery):
        d = copy_of(prepared, tmp_path, f"k{j}")
        with pytest.raises(Killed):
            compact.compact_run(d, kill_at(names.index(first)))
        with pytest.raises(Killed):
            compact.compact_run(d, kill_at(j))
        assert state(d) == want and len(raw_records(d)) == sum(map(len, want)), f"{first}, then {name}"
        RecordFiles(d, set()).close()
        assert state(d) == want and leftovers(d) == []


@pytest.mark.slow
def test_a_real_kill_9_at_every_step(prepared, tmp_path):
    """One child process forks a compaction per step, each SIGKILLed by its hook at that step."""
    _, names, want = prepared
    dirs = [copy_of(prepared, tmp_path, f"k{i}") for i in range(len(names))]
    code = textwrap.dedent(f"""
        import json, os, signal, sys
        sys.path.insert(0, {str(REPO)!r})
        from records import compact
        compact.BATCH_ROWS = 2
        statuses = []
        for i, d in enumerate({[str(d) for d in dirs]!r}):
            pid = os.fork()
            if pid == 0:
                calls = iter(range(10**6))
                def hook(name):
                    if next(calls) == i:
                        os.kill(os.getpid(), signal.SIGKILL)
                compact.compact_run(d, hook)
                os._exit(3)  # not killed: the hook never reached step i
            statuses.append(os.waitpid(pid, 0)[1])
        print(json.dumps(statuses))
    """)
    p = subprocess.run([sys.executable, "-c", code], timeout=600, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert [os.WTERMSIG(s) if os.WIFSIGNALED(s) else None for s in json.loads(p.stdout)] == [signal.SIGKILL] * len(dirs)
    for d, name in zip(dirs, names, strict=True):
        assert state(d) == want, f"killed before {name}"
        RecordFiles(d, set()).close()
        assert state(d) == want and leftovers(d) == [], f"resumed after a kill before {name}"


def test_compacting_from_another_thread_while_records_are_written(tmp_path):
    files = RecordFiles(tmp_path, set())
    written = [rec for _, rec in records(0, 300) if rec["role"] == "candidate"]
    stop = threading.Event()
    parts = []

    def compactor():
        while not stop.is_set():
            parts.append(files.compact())

    t = threading.Thread(target=compactor)
    t.start()
    for rec in written:
        files.write("candidate-i128.jsonl", rec)
    stop.set()
    t.join()
    files.close()
    assert load_run(tmp_path).candidates == written
    assert len([p for p in parts if p is not None]) >= 1 and leftovers(tmp_path) == []


def test_a_failed_compaction_at_close_keeps_the_records_and_says_so(tmp_path, monkeypatch, capsys):
    files = RecordFiles(tmp_path, set())
    for name, rec in records(0, 2):
        files.write(name, rec)
    want = state(tmp_path)

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("records.jsonl.build", full)
    files.close()
    assert "compacting the records" in capsys.readouterr().err
    assert state(tmp_path) == want and leftovers(tmp_path) == ["sealed-000001"]
    monkeypatch.undo()
    RecordFiles(tmp_path, set()).close()
    assert state(tmp_path) == want and leftovers(tmp_path) == []


def test_the_compact_command_converts_a_run_directory(tmp_path):
    run = tmp_path / "run"
    (run / "records").mkdir(parents=True)
    recs = records(0, 2)
    for name, rec in recs:
        with open(run / "records" / name, "a") as f:
            f.write(json.dumps(rec) + "\n")
    want = state(run)
    p = subprocess.run([sys.executable, "-m", "records.compact", str(run)], cwd=REPO, capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout == f"{run}: 1 part(s) written: part-000001\n"
    assert state(run) == want and leftovers(run) == []
    p = subprocess.run([sys.executable, "-m", "records.compact", str(tmp_path / "nope")], cwd=REPO,
                       capture_output=True, text=True)
    assert p.returncode == 2 and "has no records/ directory" in p.stderr
