"""The driver when replicas fail, no Ray: a dead reference pool is a harness failure naming its replicas, and
turns whose previous turn's cache is gone are flagged (`cache_lost`)."""

from __future__ import annotations

import json

import pytest

from harness.errors import HarnessError
from harness.recorded import RunSoFar
from harness.sessions import SessionLoop
from records.incidents import load_incidents
from records.jsonl import load_run
from records.resume import Recorded
from tests.harness.helpers import journal_lines, make_sessions, read_lines
from tests.harness.test_driver import INTERVAL, drive, with_servers


def test_a_reference_pool_that_cannot_be_served_is_a_harness_failure(tmp_path):
    sessions = make_sessions(2)
    with pytest.raises(HarnessError) as e:
        with_servers(tmp_path, 1, lambda c, r: drive(tmp_path / "run", sessions, c, ["http://127.0.0.1:9"],
                                                     concurrency=(1,), recover=0.3))
    assert "the reference pool cannot be served" in str(e.value) and "reference-r0" in str(e.value)


def test_turns_after_a_resume_are_flagged_cache_lost(tmp_path):
    sessions = make_sessions(3)
    full = tmp_path / "full"
    (tmp_path / "a").mkdir()
    with_servers(tmp_path / "a", 1, lambda c, r: drive(full, sessions, c, r, concurrency=(1,)))
    assert all(r["cache_lost"] is None for r in read_lines(full) if r["role"] == "candidate")
    part = tmp_path / "part"  # an interrupted run that recorded turn 0 of every session
    (part / "records").mkdir(parents=True)
    lines = journal_lines(full, f"candidate-i{INTERVAL}")
    (part / "records" / f"candidate-i{INTERVAL}.jsonl").write_text(
        "".join(x + "\n" for x in lines if json.loads(x)["turn"] == 0))
    existing = load_run(part).candidates_by_key()
    (tmp_path / "b").mkdir()
    with_servers(tmp_path / "b", 1, lambda c, r: drive(part, sessions, c, r, concurrency=(1,), existing=existing))
    turn1 = [r for r in read_lines(part) if r["role"] == "candidate" and r["turn"] == 1]
    assert len(turn1) == 3 and all(r["cache_lost"] == "resume" and r["cached_tokens"] == 0 for r in turn1)


class _Stub:
    """Just what SessionLoop._cache_lost reads: what earlier processes recorded, and who answered each turn."""

    def __init__(self, recorded: list[str], served):
        self.so_far = RunSoFar({k: Recorded(k, 0, None, False, b"") for k in recorded})
        self.served = served


@pytest.mark.parametrize("prev,served_before,now,want", [
    (None, None, ("i16-r0", 0), None),  # turn 0: nothing to lose
    ("k0", ("i16-r0", 0), ("i16-r0", 0), None),  # same replica, same incarnation
    ("k0", ("i16-r0", 0), ("i16-r0", 1), "replica restart"),
    ("k0", ("i16-r0", 1), ("i16-r1", 0), "fail-over"),
    ("old", None, ("i16-r0", 0), "resume"),  # recorded by an earlier process
    ("k0", None, ("i16-r0", 0), None),  # the previous turn failed: nothing was cached
])
def test_cache_lost_causes(prev, served_before, now, want):
    stub = _Stub(["old"], {"k0": served_before} if served_before else {})
    assert SessionLoop._cache_lost(stub, prev, now) == want


def test_incidents_of_external_replicas_are_recorded(tmp_path):
    from records.incidents import IncidentLog

    log = IncidentLog(tmp_path)
    log.write({"pool": "i16", "replica_id": "i16-r0", "recovered": True})
    (tmp_path / "incidents.jsonl").open("a").write('{"pool": "half')  # a killed writer's partial line
    assert load_incidents(tmp_path) == [{"pool": "i16", "replica_id": "i16-r0", "recovered": True}]
    IncidentLog(tmp_path).write({"pool": "reference"})  # the partial line is cut before appending
    assert [i["pool"] for i in load_incidents(tmp_path)] == ["i16", "reference"]
