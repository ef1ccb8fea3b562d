"""The driver's load shapes against in-process fake servers: open-loop rate points, warmup, --duration,
--max-error-rate, per-point counts, and a resume that sends the references an earlier process left."""

from __future__ import annotations

import json

from harness.arrival import schedule
from harness.sweep import Point
from records.jsonl import load_run
from records.reader import RunReader
from tests.harness.helpers import duplicate_keys, expected_candidate_keys, journal_lines, make_sessions, read_lines
from tests.harness.test_driver import INTERVAL, drive, with_servers

POOL = f"i{INTERVAL}"


def _points(run_dir) -> dict[str, dict]:
    return {r["point"]: r for r in RunReader(run_dir).records("points")}


def test_rate_point_sends_at_planned_times_in_turn_order_with_the_closed_loop_outputs(tmp_path):
    sessions = make_sessions(6)
    run_dir = tmp_path / "run"
    with_servers(tmp_path, 2, lambda c, r: drive(run_dir, sessions, c, r, concurrency=(2,), request_rate=(40.0,),
                                                 arrival="poisson", seed=3))
    cands = [r for r in read_lines(run_dir) if r["role"] == "candidate"]
    assert not duplicate_keys(cands)
    closed = {(r["session_id"], r["turn"]): r for r in cands if r["concurrency"] == 2}
    rate = {(r["session_id"], r["turn"]): r for r in cands if r["request_rate"] == 40.0}
    assert set(rate) == set(closed) and len(rate) == 12
    assert {r["key"] for r in rate.values()} == {f"{POOL}-r40/s{k}/{n}" for k in range(6) for n in (0, 1)}
    plan = schedule([2] * 6, 40.0, "poisson", 3)
    wall0 = rate[("s0", 0)]["t_planned"]
    for (sid, n), r in rate.items():
        assert r["concurrency"] is None and r["arrival"] == "poisson" and r["error"] is None
        assert abs(r["t_planned"] - wall0 - plan[(int(sid[1:]), n)]) < 1e-6  # the seeded schedule, exactly
        assert r["t_start"] >= r["t_planned"] - 0.02  # never sent before its time (sleep granularity)
        assert r["output_ids"] == closed[(sid, n)]["output_ids"]  # the same answers as the closed loop
        assert r["ttft"] <= r["ttst"] <= r["e2e"]  # the second token came with the first chunk or later
    for k in range(6):
        t0, t1 = rate[(f"s{k}", 0)], rate[(f"s{k}", 1)]
        assert t1["replica_id"] == t0["replica_id"]  # the session's cache lives on one replica
        assert t1["t_start"] >= t0["t_start"] + t0["e2e"] - 1e-3  # turn 1 after turn 0's answer
        assert t1["input_ids"] == t0["input_ids"] + t0["output_ids"] + [10, 35, 10]
    for r in closed.values():  # a closed-loop record is sent when planned
        assert r["t_planned"] == r["t_start"] and r["request_rate"] is None and r["arrival"] is None
    points = _points(run_dir)
    assert set(points) == {"c2", "r40"}
    for p in points.values():
        assert (p["planned"], p["sent"], p["answered"], p["failed"], p["skipped"], p["unsent"]) == (12, 12, 12, 0,
                                                                                                   0, 0)
        assert p["stopped"] is None
    assert points["r40"]["request_rate"] == 40.0 and points["r40"]["concurrency"] is None
    stats = sorted(s["key"] for s in load_run(run_dir).stats)
    assert stats == sorted(f"stats/{POOL}-{p}/{POOL}-r{k}" for p in ("c2", "r40") for k in (0, 1))


def test_warmup_is_recorded_apart_and_leaves_the_gated_requests_cold(tmp_path):
    sessions = make_sessions(2)
    run_dir = tmp_path / "run"
    with_servers(tmp_path, 1, lambda c, r: drive(run_dir, sessions, c, r, concurrency=(1,), warmup=3))
    warm = list(RunReader(run_dir).records("warmup"))
    assert [w["key"] for w in warm] == [f"warmup/{POOL}-c1/{i}" for i in range(3)]
    assert all(w["role"] == "warmup" and w["error"] is None and w["turn"] == 0 for w in warm)
    assert [w["input_ids"] for w in warm] == [list(sessions[i % 2].turns[0].input_ids) for i in range(3)]
    run = load_run(run_dir)
    assert {r["key"] for r in run.candidates} == expected_candidate_keys(sessions, (INTERVAL,), (1,))
    assert all(r["cached_tokens"] == 0 for r in run.candidates if r["turn"] == 0)  # flushed after the warmup
    p = _points(run_dir)["c1"]
    assert (p["warmup"], p["warmup_failed"], p["warmup_requests"]) == (3, 0, 3)
    # the reference pool never saw a warmup input twice and no warmup got a reference of its own
    assert len([x for x in (tmp_path / "ref.rids").read_text().split() if not x.endswith("/window-ref")]) == 4


def test_duration_stops_a_rate_point_at_its_planned_times(tmp_path):
    sessions = make_sessions(6)
    run_dir = tmp_path / "run"
    progress = with_servers(tmp_path, 1, lambda c, r: drive(run_dir, sessions, c, r, concurrency=(),
                                                            request_rate=(2.0,), duration=1.2))
    cands = load_run(run_dir).candidates
    # planned at 0, 0.5 and 1.0 s (all turns 0): sent; the 9 planned from 1.5 s on are not, and not recorded
    assert sorted(r["key"] for r in cands) == [f"{POOL}-r2/s{k}/0" for k in range(3)]
    p = _points(run_dir)["r2"]
    assert (p["planned"], p["sent"], p["answered"], p["unsent"]) == (12, 3, 3, 9)
    assert p["stopped"] == "reached --duration 1.2s" and p["duration"] == 1.2
    assert progress.points[0].line(POOL, Point(rate=2.0, arrival="constant")).endswith(
        "stopped early (reached --duration 1.2s): 9 not sent")


def test_max_error_rate_stops_a_point_and_counts_add_up(tmp_path):
    sessions = make_sessions(3)
    run_dir = tmp_path / "run"
    progress = with_servers(tmp_path, 0, lambda c, r: drive(run_dir, sessions, ["http://127.0.0.1:9"], r,
                                                            concurrency=(1,), recover=0.3, max_error_rate=0.5))
    cands = {r["key"]: r for r in load_run(run_dir).candidates}
    assert set(cands) == {f"{POOL}-c1/s0/0", f"{POOL}-c1/s0/1"}
    assert cands[f"{POOL}-c1/s0/1"]["error"] == "not run: turn 0 of the session failed"
    (counts,) = progress.points
    assert (counts.planned, counts.sent, counts.answered, counts.failed, counts.skipped, counts.unsent) == (
        6, 1, 0, 1, 1, 4)
    assert counts.stopped == "over --max-error-rate 0.5: 1/1 failed"


def test_resume_sends_the_references_an_earlier_process_left_unanswered(tmp_path):
    """Issue 27 finding 2: candidates recorded, their references in flight when the run stopped."""
    sessions = make_sessions(4)
    full = tmp_path / "full"
    (tmp_path / "a").mkdir()
    with_servers(tmp_path / "a", 1, lambda c, r: drive(full, sessions, c, r, concurrency=(1,)))
    part = tmp_path / "part"
    (part / "records").mkdir(parents=True)
    cand_lines = journal_lines(full, f"candidate-{POOL}")
    (part / "records" / f"candidate-{POOL}.jsonl").write_text("".join(x + "\n" for x in cand_lines))
    ref_lines = journal_lines(full, "reference")
    (part / "records" / "reference.jsonl").write_text(ref_lines[0] + "\n")  # one of eight answered
    recorded = load_run(part)
    existing, existing_refs = recorded.candidates_by_key(), recorded.references
    assert len(existing) == 8 and len(existing_refs) == 1
    (tmp_path / "b").mkdir()
    progress = with_servers(tmp_path / "b", 1, lambda c, r: drive(part, sessions, c, r, concurrency=(1,),
                                                                  existing=existing, existing_refs=existing_refs))
    after = load_run(part)
    assert set(after.references) == {json.loads(x)["input_hash"] for x in cand_lines}  # every candidate's
    assert not duplicate_keys(read_lines(part))
    assert not (tmp_path / "b" / "cand0.rids").exists() or not (tmp_path / "b" / "cand0.rids").read_text().split()
    assert len((tmp_path / "b" / "ref.rids").read_text().split()) == 7  # only the seven that were missing
    assert progress.mismatches == 0 and progress.references == 7


def test_resumed_rate_point_equals_an_uninterrupted_one(tmp_path):
    sessions = make_sessions(4)
    full, part = tmp_path / "full", tmp_path / "part"
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
    with_servers(tmp_path / "a", 1, lambda c, r: drive(full, sessions, c, r, concurrency=(), request_rate=(50.0,),
                                                       arrival="poisson", warmup=2))
    (part / "records").mkdir(parents=True)
    cand_lines = journal_lines(full, f"candidate-{POOL}")
    kept = [x for x in cand_lines if json.loads(x)["turn"] == 0][:3]  # stopped mid-point: 3 of 8, no references
    (part / "records" / f"candidate-{POOL}.jsonl").write_text("".join(x + "\n" for x in kept))
    recorded = load_run(part)
    with_servers(tmp_path / "b", 1, lambda c, r: drive(part, sessions, c, r, concurrency=(), request_rate=(50.0,),
                                                       arrival="poisson", warmup=2,
                                                       existing=recorded.candidates_by_key(), existing_refs={}))
    a, b = load_run(full), load_run(part)
    assert not duplicate_keys(read_lines(part))
    assert {r["key"]: r["output_ids"] for r in a.candidates} == {r["key"]: r["output_ids"] for r in b.candidates}
    assert set(a.references) == set(b.references)
    # nothing recorded was sent again, and the resumed point sent no second warmup
    sent = [x.split(":", 1)[1] for x in (tmp_path / "b" / "cand0.rids").read_text().split()
            if not x.endswith("/window")]  # less the restore-window probes of the turns it sent
    assert len(sent) == 5 and not {json.loads(x)["key"] for x in kept} & set(sent)
    assert "warmup" not in {s.split("/")[0] for s in sent}


def test_resume_does_not_run_a_finished_point_again(tmp_path):
    sessions = make_sessions(6)
    run_dir = tmp_path / "run"
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
    with_servers(tmp_path / "a", 1, lambda c, r: drive(run_dir, sessions, c, r, concurrency=(), request_rate=(2.0,),
                                                       duration=1.2))
    recorded = load_run(run_dir)
    progress = with_servers(tmp_path / "b", 1, lambda c, r: drive(
        run_dir, sessions, c, r, concurrency=(), request_rate=(2.0,), duration=1.2,
        existing=recorded.candidates_by_key(), existing_refs=recorded.references))
    assert progress.points == [] and not (tmp_path / "b" / "cand0.rids").exists()
    assert len(load_run(run_dir).candidates) == 3
