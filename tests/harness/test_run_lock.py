"""One writer per run directory, and how a stopped run exits (issue 27, finding 3 and the smaller points): a
resume of a run that another process is writing is refused with exit 2 naming that process; a lock left by a dead
process is taken over; SIGTERM exits 143 with the resume hint. Against already-running fake servers (no Ray)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from harness.run import main
from records.lock import LOCK_FILE
from reports.gate import EXIT_INCONCLUSIVE
from tests.harness.helpers import (
    FAKE_SERVER,
    REPO,
    candidate_args,
    check_complete,
    make_sessions,
    read_lines,
    reference_args,
    server_processes,
    write_workload,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def endpoints():
    """A slow candidate (I = 16) and reference: a run of 6 sessions takes several seconds (36 candidate requests of
    8 tokens, 0.04 s each), long enough to be caught while it writes."""
    argvs = (candidate_args(16, "--token-delay", "0.04"), reference_args("--token-delay", "0.04"))
    with server_processes(FAKE_SERVER, argvs, "fake servers") as urls:
        yield urls


def harness_args(tmp_path, urls, sessions) -> list[str]:
    workload = write_workload(tmp_path / "w.jsonl", sessions)
    return ["--suite", str(workload), "--endpoint", urls[0], "--reference-endpoint", urls[1], "--concurrency",
            "1,2", "--runs-dir", str(tmp_path / "runs"), "--no-progress"]


def start_run(tmp_path, urls, sessions, run_id: str) -> subprocess.Popen:
    """`python -m harness.run` in a subprocess; returns once it has recorded something."""
    cmd = [sys.executable, "-m", "harness.run", *harness_args(tmp_path, urls, sessions), "--run-id", run_id]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not any(r["role"] == "candidate" for r in _records(tmp_path / "runs" / run_id)):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    return proc


def _records(run_dir) -> list[dict]:
    try:
        return read_lines(run_dir)
    except (OSError, ValueError):
        return []


def test_a_resume_while_the_run_writes_is_refused_naming_its_pid(tmp_path, endpoints, capsys):
    """c76ee7a: this resume wrote into the directory beside the running run (duplicate keys)."""
    sessions = make_sessions(6, turns=3)
    run = start_run(tmp_path, endpoints, sessions, "r1")
    run_dir = tmp_path / "runs" / "r1"
    holder = json.loads((run_dir / LOCK_FILE).read_text())
    assert holder["pid"] == run.pid and "harness/run.py --suite" in holder["command"]
    rc = main(["--resume", str(run_dir), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"run directory {run_dir} is in use by pid {run.pid} on host" in err
    # INCONCLUSIVE (exit 3), not PASS: so few short turns exercise too little (reports/exercised.py)
    assert run.wait(timeout=120) == EXIT_INCONCLUSIVE, run.communicate()
    assert not (run_dir / LOCK_FILE).exists()  # released at the end
    check_complete(run_dir, sessions, intervals=(16,))  # one writer: no duplicate key, nothing missing


def test_a_lock_of_a_dead_process_is_taken_over(tmp_path, endpoints, capsys):
    sessions = make_sessions(3)
    # INCONCLUSIVE (exit 3), not PASS: so few short turns exercise too little (reports/exercised.py)
    assert main([*harness_args(tmp_path, endpoints, sessions), "--run-id", "r2"]) == EXIT_INCONCLUSIVE
    run_dir = tmp_path / "runs" / "r2"
    hold = f"from records.lock import RunLock; RunLock.acquire({str(run_dir)!r}); import time; time.sleep(60)"
    dead = subprocess.Popen([sys.executable, "-c", hold], cwd=REPO)
    deadline = time.monotonic() + 30
    while not (run_dir / LOCK_FILE).exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(dead.pid, signal.SIGKILL)
    dead.wait()
    capsys.readouterr()
    assert main(["--resume", str(run_dir), "--no-progress"]) == EXIT_INCONCLUSIVE  # r2's verdict (a tiny run)
    assert f"took over the lock of {run_dir} from pid {dead.pid}" in capsys.readouterr().out
    assert not (run_dir / LOCK_FILE).exists()
    check_complete(run_dir, sessions, intervals=(16,))


def test_sigterm_exits_143_with_the_resume_hint(tmp_path, endpoints):
    """c76ee7a: SIGTERM killed the harness (status -15 here, 134 with Ray's abort trace) with no resume hint."""
    run = start_run(tmp_path, endpoints, make_sessions(6, turns=3), "r3")
    run.send_signal(signal.SIGTERM)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 143, out + err
    run_dir = tmp_path / "runs" / "r3"
    assert f"terminated (SIGTERM); records so far are kept. Finish with: python -m harness.run --resume {run_dir}" \
        in err
    assert "Traceback" not in err and not (run_dir / LOCK_FILE).exists(), err
    assert os.readlink(tmp_path / "runs" / "latest") == "r3"
