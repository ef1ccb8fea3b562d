"""--drivers on a local Ray with fake servers: a run split over driver actors is complete and plans what one
driver plans; a driver actor killed mid-run stops the run, and --resume finishes it with nothing lost, nothing
duplicated and nothing recorded sent again."""

from __future__ import annotations

import threading
import time

import pytest

from harness.run import main
from reports.gate import EXIT_HARNESS_FAILED, EXIT_INCONCLUSIVE
from tests.harness.helpers import check_complete, duplicate_keys, make_sessions, read_lines, run_args

pytestmark = pytest.mark.slow


def _offsets(run_dir) -> dict[str, float]:
    """Each open-loop candidate's planned send time, in seconds after its sweep point's start."""
    recs = read_lines(run_dir)
    starts = {r["key"].split("/")[1]: r["t_start"] for r in recs if r["role"] == "point"}
    return {r["key"]: round(r["t_planned"] - starts[r["key"].split("/")[0]], 6) for r in recs
            if r["role"] == "candidate" and r.get("request_rate") is not None}


def test_two_driver_actors_record_what_one_driver_records(ray_local, workdir, capsys):
    sessions = make_sessions(6)
    extra = ("--request-rate", "40", "--arrival", "poisson", "--seed", "5")
    runs = {}
    for n in (1, 2):
        assert main(run_args(workdir, sessions, "--run-id", f"d{n}", "--drivers", str(n), *extra)) == \
            EXIT_INCONCLUSIVE  # so few short turns exercise too little (reports/exercised.py)
        runs[n] = workdir / "runs" / f"d{n}"
        out = capsys.readouterr().out
        assert ("driver actors: 2 on 1 node(s)" in out) == (n == 2)
        assert "candidates: 72 recorded; this process sent 72 (72 answered" in out  # the actors' counts merged
    for n in (1, 2):
        recs = read_lines(runs[n])
        assert not duplicate_keys(recs)  # one reference per input, whichever actor met it first
        cands = [r for r in recs if r["role"] == "candidate"]
        assert len({r["key"] for r in cands if "-r40/" in r["key"]}) == 24
        assert {r["key"]: r["replica_id"] for r in cands} == {r["key"]: r["replica_id"] for r in
                                                              read_lines(runs[1]) if r["role"] == "candidate"}
    one, two = ({r["key"]: r["output_ids"] for r in read_lines(runs[n]) if r["role"] in ("candidate", "reference")}
                for n in (1, 2))
    assert one == two
    assert _offsets(runs[2]) == _offsets(runs[1]) and len(_offsets(runs[1])) == 24  # the same open-loop plan
    assert not (runs[2] / "drivers").exists()  # every actor's journals joined into the run's records


def test_killed_driver_actor_then_resume_loses_and_doubles_nothing(ray_local, workdir):
    import ray

    sessions = make_sessions(6)
    args = run_args(workdir, sessions, "--drivers", "2", token_delay=0.05)
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("rc", main([*args, "--run-id", "kill"])))
    t.start()
    run_dir = workdir / "runs" / "kill"
    journal = run_dir / "drivers" / "d1" / "candidate-i16.jsonl"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and t.is_alive():
        if journal.exists() and len(journal.read_text().splitlines()) >= 2:
            break
        time.sleep(0.02)
    ray.kill(ray.get_actor("specgate-driver-kill-d1"), no_restart=True)
    t.join(timeout=120)
    assert result.get("rc") == EXIT_HARNESS_FAILED
    first = {r["key"] for r in read_lines(run_dir)}  # the dead actor's records are kept
    # c=1 runs on one actor (d0); d1 was killed with its share of the c=2 point under way
    assert 2 <= sum(k.startswith("i16-c2/") for k in first) < 12
    sent_before = len((workdir / "rids.log").read_text().split())

    assert main([*args, "--resume", str(run_dir)]) == EXIT_INCONCLUSIVE
    check_complete(run_dir, sessions)  # every key once, one reference per distinct input, no error
    sent_after = [rid.split(":", 1)[1].split("#")[0]
                  for rid in (workdir / "rids.log").read_text().split()[sent_before:]]
    assert not set(sent_after) & first  # nothing recorded was sent again
