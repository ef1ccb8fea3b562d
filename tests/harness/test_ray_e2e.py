"""`python -m harness.run` on a local Ray with fake servers: complete runs, a killed replica, SIGINT + resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from harness.run import main
from reports.gate import EXIT_INCONCLUSIVE
from tests.harness.helpers import REPO, check_complete, duplicate_keys, make_sessions, read_lines, run_args

pytestmark = pytest.mark.slow


def test_local_ray_run_is_complete_and_passes_the_gate(ray_local, workdir):
    sessions = make_sessions(6)
    # INCONCLUSIVE (exit 3), not PASS: so few short turns exercise too little (reports/exercised.py)
    assert main(run_args(workdir, sessions, "--run-id", "clean")) == EXIT_INCONCLUSIVE
    run_dir = workdir / "runs" / "clean"
    cands = check_complete(run_dir, sessions)
    assert (workdir / "runs" / "latest").resolve() == run_dir.resolve()
    assert {r["replica_id"] for r in cands} == {"i16-r0", "i16-r1", "i32-r0", "i32-r1"}
    assert all(r["node_id"] for r in cands)
    assert (run_dir / "config.json").exists() and (run_dir / "report.html").exists()
    # --reference-nice (default 10) on top of what the Ray worker had; candidates keep the worker's own
    nice = {f.stem: int(f.read_text()) for f in (workdir / "pids").glob("*.nice")}
    cand = {n for k, n in nice.items() if k.startswith("candidate-")}
    ref = {n for k, n in nice.items() if k.startswith("reference-")}
    assert len(cand) == 1 and len(ref) == 1 and ref == {min(19, cand.pop() + 10)}


def test_killed_replica_is_restarted_and_its_requests_retried(ray_local, workdir):
    sessions = make_sessions(6)
    args = run_args(workdir, sessions, "--run-id", "kill", intervals="16", token_delay=0.05)
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("rc", main(args)))
    t.start()
    rids = workdir / "rids.log"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # a few candidate requests in, during the first sweep point
        if rids.exists() and sum(":i16-" in x for x in rids.read_text().split()) >= 3:
            break
        time.sleep(0.05)
    victim = sorted((workdir / "pids").glob("candidate-i16-*.pid"))[0]
    os.kill(int(victim.read_text()), signal.SIGKILL)
    t.join(timeout=120)
    # INCONCLUSIVE (exit 3), not PASS: so few short turns exercise too little (reports/exercised.py)
    assert result.get("rc") == EXIT_INCONCLUSIVE
    cands = check_complete(workdir / "runs" / "kill", sessions, intervals=(16,))
    # the request the kill cut was re-sent: a turn, or the restore-window probe that followed one (harness/window.py)
    assert sum(r["retries"] + r.get("window_retries", 0) for r in cands) > 0
    assert len(list((workdir / "pids").glob("candidate-i16-*.pid"))) == 3  # Ray restarted the actor's server


def test_sigint_then_resume_equals_an_uninterrupted_run(ray_local, workdir):
    sessions = make_sessions(6)
    # INCONCLUSIVE (exit 3), not PASS: so few short turns exercise too little (reports/exercised.py)
    assert main(run_args(workdir, sessions, "--run-id", "whole")) == EXIT_INCONCLUSIVE
    whole = {r["key"] for r in read_lines(workdir / "runs" / "whole")}
    (workdir / "rids.log").unlink()

    env = dict(os.environ, PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "harness.run", *run_args(workdir, sessions, token_delay=0.05),
           "--address", ray_local]
    # SIGINT back to its default in the child: a shell starts background jobs with it ignored, and a
    # child inherits that (then the interrupt below would never arrive)
    proc = subprocess.Popen([*cmd, "--run-id", "cut"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    cand_file = workdir / "runs" / "cut" / "records" / "candidate-i16.jsonl"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
        if cand_file.exists() and len(cand_file.read_text().splitlines()) >= 4:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 130, out
    assert "--resume" in out
    first = {r["key"] for r in read_lines(workdir / "runs" / "cut")}
    assert 0 < len(first) < len(whole)
    sent_before = len((workdir / "rids.log").read_text().split())

    resumed = subprocess.run([*cmd, "--resume", str(workdir / "runs" / "cut")], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=120)
    assert resumed.returncode == EXIT_INCONCLUSIVE, resumed.stdout + resumed.stderr  # as the whole run's verdict
    recs = read_lines(workdir / "runs" / "cut")
    assert not duplicate_keys(recs) and {r["key"] for r in recs} == whole
    sent_after = [rid.split(":", 1)[1].split("#")[0]
                  for rid in (workdir / "rids.log").read_text().split()[sent_before:]]
    assert not set(sent_after) & first  # nothing recorded was sent again
