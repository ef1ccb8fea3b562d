"""harness/recorded.py: what a resumed driver takes from the records of earlier processes."""

from __future__ import annotations

from harness.recorded import RunSoFar
from records.jsonl import RecordFiles
from records.resume import Recorded, RefDone
from records.schema import POINTS_FILE, point_key, point_record_key
from tests.harness.helpers import make_sessions

SESSIONS = make_sessions(3, turns=3)


def cand(key: str, output: list[int], error: str | None = None, h: str | None = None) -> dict:
    pool, rest = key.split("-", 1)
    sid, turn = rest.split("/")[1], int(rest.split("/")[2])
    return {"key": key, "turn": turn, "input_hash": h or f"h-{key}", "error": error, "output_ids": output,
            "input_ids": [1, 2, turn], "pool": pool, "session_id": sid, "max_new_tokens": 8}


def test_a_resumed_run_skips_what_is_recorded_and_reads_back_only_what_it_builds_on(tmp_path):
    k = [point_key("i128", "c4", "s0", n) for n in range(3)] + [point_key("i128", "c4", "s1", 0)]
    recs = {k[0]: cand(k[0], [5]), k[1]: cand(k[1], [6], h="answered"), k[3]: cand(k[3], [7], error="boom")}
    asked: list[set] = []

    def io(keys):
        asked.append(set(keys))
        return {key: (recs[key]["input_ids"], recs[key]["output_ids"]) for key in keys}

    so_far = RunSoFar(recs, {"answered": {"error": None, "output_ids": [9]}}, io)
    assert so_far.candidates[k[0]] == Recorded.of(recs[k[0]]) and so_far.references == {
        "answered": RefDone(False, RefDone.of({"output_ids": [9]}).output)}
    files = RecordFiles(tmp_path, set())
    files.write(POINTS_FILE, {"key": point_record_key("i128", "c1"), "role": "point"})
    files.close()
    owed = so_far.load(tmp_path, {"i128": tuple(SESSIONS)}, ["c1", "c4"])
    # k[0]'s reference is missing (an earlier process stopped before it came); k[3] failed: none is owed
    assert [(r.key, s.session_id) for r, s in owed] == [(k[0], "s0")]
    # k[1] and k[3]: the last recorded turns of s0 and s1, whose next turns are still to be recorded
    assert asked == [{k[0], k[1], k[3]}]
    assert so_far.io[k[1]] == ([1, 2, 1], [6]) and so_far.mismatches() == 1  # [6] against the reference's [9]
    assert so_far.written(point_record_key("i128", "c1")) and not so_far.written(point_record_key("i128", "c4"))
    todo = so_far.todo("i128", "c4", tuple(SESSIONS))
    assert [s.session_id for _, s in todo] == ["s0", "s1", "s2"]  # each has a turn left
    assert so_far.left("i128", "c4", todo) == 9 - 3
    assert so_far.started("i128", "c4") and not so_far.started("i128", "c1")


def test_a_fresh_run_has_nothing_so_far(tmp_path):
    so_far = RunSoFar()
    assert so_far.load(tmp_path, {"i128": tuple(SESSIONS)}, ["c4"]) == [] and so_far.io == {}
    assert so_far.mismatches() == 0 and not so_far.started("i128", "c4")
    assert so_far.left("i128", "c4", so_far.todo("i128", "c4", tuple(SESSIONS))) == 9
