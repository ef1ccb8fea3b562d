"""records/resume.py: what a resume keeps of recorded requests agrees with the records it summarizes."""

from __future__ import annotations

import shutil

from records.compact import compact_run
from records.jsonl import RecordFiles, load_run
from records.resume import Recorded, RefDone, ResumeState, written_point_keys
from records.schema import POINTS_FILE, STATS_FILE, WARMUP_FILE, point_record_key, warmup_key
from tests.reports.factory import pair, prompt, synthetic_run, write_run


def record_differs(cand: dict, ref: dict) -> bool:
    """The live mismatch test on whole records: both answered, output ids differ."""
    return cand["error"] is None and ref["error"] is None and cand["output_ids"] != ref["output_ids"]


def _run(tmp_path):
    run_dir = synthetic_run(tmp_path / "run", fault=True, soft_sessions=1)
    recs = pair(prompt(140, seed=77), [1, 2, 3], [1, 2, 4], pool="i128", interval=128, concurrency=8,
                session_id="late", error="boom")
    recs += pair(prompt(141, seed=78), [5] * 7, pool="i128", interval=128, concurrency=8, session_id="late2")
    recs[-1]["output_ids"] = [1 << 40]  # kept in _extra
    recs.append(dict(recs[0], output_ids=[9]))  # a duplicate key: the first record counts
    recs += pair(prompt(142, seed=79), [3] * 4, pool="i128", interval=128, concurrency=8, session_id="late3")[:1]
    write_run(run_dir, recs)
    return run_dir


def test_the_resume_state_summarizes_exactly_what_load_run_holds(tmp_path):
    run_dir = _run(tmp_path)
    parts = tmp_path / "parts"
    shutil.copytree(run_dir, parts)
    compact_run(parts)
    for d in (run_dir, parts):
        run = load_run(d)
        state = ResumeState.read(d)
        assert state.candidates == {c["key"]: Recorded.of(c) for c in run.candidates}
        assert state.references == {h: RefDone.of(r) for h, r in run.references.items()}
        assert state.keys == {c["key"] for c in run.candidates} | {r["key"] for r in run.references.values()} | {
            s["key"] for s in run.stats}
        # the live mismatch count of a resumed run is the one the records give
        for c in run.candidates:
            ref = run.references.get(c["input_hash"])
            if ref is not None:
                assert state.candidates[c["key"]].differs(state.references[c["input_hash"]]) == \
                    record_differs(c, ref)
                assert Recorded.of(c).differs(RefDone.of(ref)) == record_differs(c, ref)  # a fresh record
        assert any(c.failed for c in state.candidates.values())
        assert [c.key for c in state.unanswered()] == [c["key"] for c in run.candidates if c["error"] is None
                                                       and c["input_hash"] not in run.references]


def test_io_reads_just_the_turns_asked_for(tmp_path):
    run_dir = _run(tmp_path)
    compact_run(run_dir)
    run = load_run(run_dir)
    want = [c for c in run.candidates if c["turn"] == 1][:3]
    got = ResumeState.read(run_dir).io([c["key"] for c in want] + ["not-a-key"])
    assert got == {c["key"]: (c["input_ids"], c["output_ids"]) for c in want}


def test_the_written_sweep_point_and_warmup_keys_are_what_a_resume_must_not_write_again(tmp_path):
    files = RecordFiles(tmp_path, set())
    point, warmup = point_record_key("i128", "c4"), warmup_key("i128", "c4", 0)
    files.write(POINTS_FILE, {"key": point, "role": "point"})
    files.write(WARMUP_FILE, {"key": warmup, "role": "warmup"})
    files.write(STATS_FILE, {"key": "stats/i128-c4/r0", "role": "stats"})
    files.close()
    assert written_point_keys(tmp_path) == {point, warmup}
    assert written_point_keys(tmp_path / "nothing-here") == set()
