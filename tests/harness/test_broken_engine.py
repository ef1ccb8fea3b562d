"""A broken candidate or reference engine yields a verdict in bounded time (issue 18).

The built-in engine (random tiny weights) behind tests/harness/faulty_serve.py, which gives
one role's replicas `--test-loop-fault`: an engine loop that raises (or hangs) after N steps.
The server then fails its in-flight requests with 503 and exits; Ray restarts the replica (at
most --max-replica-restarts times) and the driver re-sends what was lost. Outcomes:

* the candidate recovers on a restarted replica: records complete and duplicate-free, the
  incident (with the crash's first lines) in incidents.jsonl and the report;
* the candidate keeps crashing: the gate fails (exit 1) and the report shows the crash;
* the reference keeps crashing: the harness fails (exit 2) naming the replica and its log.
"""

from __future__ import annotations

import sys
import time

import pytest

from harness.run import main
from records.incidents import load_incidents
from reports.gate import EXIT_INCONCLUSIVE
from tests.harness.helpers import check_complete, duplicate_keys, make_sessions, read_lines, write_workload

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def run(workdir, run_id: str, role: str, fault: str, *extra: str, server_extra: str = "", sessions=None):
    """One harness run with `role`'s replicas broken; returns (exit status, seconds, run dir, sessions)."""
    sessions = sessions or make_sessions(4, prompt_len=24, max_new=10)
    workload = write_workload(workdir / f"{run_id}.jsonl", sessions)
    server = f"{sys.executable} -m tests.harness.faulty_serve --break {role} --fault {fault}"
    if server_extra:
        server += f" --extra '{server_extra}'"
    t0 = time.monotonic()
    rc = main(["--suite", str(workload), "--model-path", "random", "--model-preset", "tiny", "--intervals", "16",
               "--block-size", "4", "--concurrency", "1,2", "--runs-dir", str(workdir / "runs"), "--run-id", run_id,
               "--no-progress", "--startup-timeout", "120", "--request-timeout", "60", "--recover-timeout", "60",
               "--max-soft-rate", "1", "--server-command", server, *extra])
    took = time.monotonic() - t0
    print(f"{run_id}: exit {rc} after {took:.1f}s")
    return rc, took, workdir / "runs" / run_id, sessions


def test_a_candidate_that_crashes_completes_on_its_restarted_replica(ray_local, workdir):
    rc, took, run_dir, sessions = run(workdir, "crash-recovers", "candidate", "raise-after:60")
    # INCONCLUSIVE (exit 3), not PASS: so few short turns exercise too little (reports/exercised.py)
    assert rc == EXIT_INCONCLUSIVE
    cands = check_complete(run_dir, sessions, intervals=(16,))  # complete, duplicate-free, no error
    incidents = load_incidents(run_dir)
    for i in incidents:
        print(f"incident: {i['replica_id']} recovered={i['recovered']} after {i.get('recovery_s')}s: {i['error']}")
    assert incidents and all(i["recovered"] and i["replica_id"] == "i16-r0" for i in incidents)
    assert all(i["recovery_s"] <= 60 for i in incidents)  # bounded by --recover-timeout
    assert any("test fault: the engine loop raised" in (i.get("excerpt") or "") for i in incidents)
    assert sum(r["retries"] for r in cands) >= 1  # what was in flight at the crash was re-sent
    assert "Replica incidents" in (run_dir / "summary.md").read_text()


def test_a_candidate_that_keeps_crashing_fails_the_gate_showing_the_crash(ray_local, workdir, capsys):
    rc, took, run_dir, _ = run(workdir, "crash-loop", "candidate", "raise-after:5", "--max-replica-restarts", "1")
    out = capsys.readouterr().out
    with capsys.disabled():
        print(f"\ncrash-loop: exit {rc} after {took:.1f}s\n" + "\n".join(x for x in out.splitlines()
                                                                      if x.startswith(("incident:", "FAIL"))))
    assert rc == 1
    recs = read_lines(run_dir)
    assert not duplicate_keys(recs)
    errors = [r for r in recs if r["role"] == "candidate" and r["error"]]
    assert errors and any("i16-r0" in r["error"] for r in errors)
    incidents = load_incidents(run_dir)
    assert incidents[-1]["recovered"] is False and incidents[-1]["log"]
    summary = (run_dir / "summary.md").read_text()
    report = (run_dir / "report.html").read_text()
    for text in (summary, report):
        assert "Replica incidents" in text and "test fault: the engine loop raised" in text
        assert "Traceback (most recent call last)" in text
    assert "incident: [candidate i16] i16-r0" in out  # the verdict names the replica and its log
    assert incidents[-1]["log"] in out


def test_a_reference_that_keeps_crashing_is_a_harness_failure_naming_it(ray_local, workdir, capsys):
    rc, took, run_dir, _ = run(workdir, "ref-crash", "reference", "raise-after:3", "--max-replica-restarts", "1")
    err = capsys.readouterr().err
    with capsys.disabled():
        print(f"\nref-crash: exit {rc} after {took:.1f}s\n" + "\n".join(x for x in err.splitlines()
                                                                     if "specgate: error" in x))
    assert rc == 2
    assert "the reference pool cannot be served" in err and "reference-r0" in err and "log /" in err
    assert not duplicate_keys(read_lines(run_dir))
    assert any(i["role"] == "reference" and not i["recovered"] for i in load_incidents(run_dir))


def test_a_candidate_whose_loop_hangs_is_restarted_and_the_run_completes(ray_local, workdir):
    rc, took, run_dir, sessions = run(workdir, "hang-recovers", "candidate", "hang-after:60",
                                      server_extra="--watchdog-timeout 8")
    # INCONCLUSIVE (exit 3), not PASS: so few short turns exercise too little (reports/exercised.py)
    assert rc == EXIT_INCONCLUSIVE
    check_complete(run_dir, sessions, intervals=(16,))
    incidents = load_incidents(run_dir)
    assert incidents and all(i["recovered"] for i in incidents)
    assert any("stalled" in i["error"] and "--watchdog-timeout 8" in i["error"] for i in incidents)
