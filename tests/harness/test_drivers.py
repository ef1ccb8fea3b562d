"""--drivers without Ray: how sessions, concurrency and plans are dealt, what is refused, and how the driver
actors' journals join the run's records (records/driver_parts.py) and share references (harness/shared_refs.py)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from harness.cli import from_argv
from harness.config import ConfigError
from harness.driver_actors import auto_drivers, resolve_drivers, split_concurrency
from harness.sessions import planned_offsets
from harness.shared_refs import ReferenceRegistry
from harness.sweep import Point
from records.driver_parts import DriverParts, adopt, driver_dir
from records.jsonl import RecordFiles
from records.lock import RunLocked
from records.resume import RefDone, ResumeState
from tests.harness.helpers import make_sessions, read_lines


def test_concurrency_shares_add_up_to_the_point_and_differ_by_at_most_one():
    for c in range(1, 40):
        for n in range(1, c + 1):
            shares = split_concurrency(c, n)
            assert sum(shares) == c and len(shares) == n and max(shares) - min(shares) <= 1
    assert split_concurrency(5, 2) == [3, 2] and split_concurrency(4, 4) == [1, 1, 1, 1]


def test_auto_is_one_driver_until_a_point_is_more_than_one_process_carries():
    assert auto_drivers((1, 4, 8, 16), (), pools=2, sequential=False, cpus=16) == 1
    assert auto_drivers((256,), (), pools=2, sequential=False, cpus=16) == 1
    assert auto_drivers((512,), (), pools=2, sequential=False, cpus=16) == 2
    assert auto_drivers((512,), (), pools=2, sequential=True, cpus=16) == 1
    assert auto_drivers((4,), (2500.0,), pools=1, sequential=False, cpus=16) == 5
    assert auto_drivers((8192,), (), pools=2, sequential=False, cpus=2) == 2  # at most one per core


def test_more_drivers_than_sessions_is_refused_and_auto_never_exceeds_them():
    sessions = {"i128": make_sessions(3), "i256": make_sessions(2)}
    assert resolve_drivers(from_argv(["--drivers", "3"], {})[0], sessions) == 3
    with pytest.raises(ConfigError, match=r"^--drivers 4: more driver actors than sessions \(the largest pool has "
                       r"3\)"):
        resolve_drivers(from_argv(["--drivers", "4"], {})[0], sessions)
    assert resolve_drivers(from_argv(["--concurrency", "100000"], {})[0], sessions) in range(1, 4)
    external = from_argv(["--endpoint", "http://a:1", "--reference-endpoint", "http://b:2", "--concurrency",
                          "100000"], {})[0]
    assert resolve_drivers(external, sessions) == 1  # no Ray cluster: auto stays in this process


def test_bad_drivers_values_are_refused_before_anything_starts():
    sessions = {"i128": make_sessions(3)}
    with pytest.raises(ConfigError, match="^--drivers must be >= 1, got 0$"):
        resolve_drivers(from_argv(["--drivers", "0"], {})[0], sessions)
    with pytest.raises(ConfigError, match="^--drivers 2: driver actors run on the Ray cluster of a target whose "
                       "replicas the harness starts; --endpoint servers"):
        resolve_drivers(from_argv(["--endpoint", "http://a:1", "--reference-endpoint", "http://b:2", "--drivers",
                                   "2"], {})[0], sessions)
    assert resolve_drivers(from_argv(["--drivers", "1", "--endpoint", "http://a:1", "--reference-endpoint",
                                      "http://b:2"], {})[0], sessions) == 1


@pytest.mark.parametrize(("drivers", "message"), [
    ("3", "--drivers 3: more driver actors than sessions (the largest pool has 2)"),
    ("0", "--drivers must be >= 1, got 0")])
def test_bad_drivers_exit_2_before_a_run_directory_exists(tmp_path, drivers, message):
    suite = tmp_path / "two.jsonl"
    suite.write_text("".join(json.dumps(s) + "\n" for s in _session_dicts(2)))
    proc = subprocess.run([sys.executable, "-m", "harness.run", "--suite", str(suite), "--intervals", "16",
                           "--concurrency", "2", "--drivers", drivers, "--runs-dir", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"specgate: error: {message}" in proc.stderr
    assert not (tmp_path / "runs").exists()  # nothing was started or written


def _session_dicts(n: int) -> list[dict]:
    from workloads.schema import dumps_jsonl

    return [json.loads(line) for line in dumps_jsonl(make_sessions(n, interval=16)).splitlines()]


def test_open_loop_shares_keep_the_one_driver_plan():
    sessions = make_sessions(7, turns=3)
    todo = list(enumerate(sessions))
    point = Point(rate=5.0, arrival="poisson")
    whole = planned_offsets(todo, point, seed=3)
    # what the head hands each of 3 actors is the whole plan's entries of its sessions, nothing recomputed
    shares = [todo[k::3] for k in range(3)]
    dealt = {i: whole[i] for share in shares for i, _ in share}
    assert dealt == whole
    times = sorted(t for plan in whole.values() for t in plan.values())
    assert len(times) == 21 and times[0] == 0.0  # one stream of 21 sends: the actors' streams superpose to it


def _rec(key: str, role: str = "candidate", **kw) -> dict:
    rec = {"schema": 1, "run_id": "r", "key": key, "role": role, "pool": "i16", "session_id": "s0", "turn": 0,
           "input_hash": "h" + key[-1], "input_ids": [1, 2], "output_ids": [3, 4], "error": None,
           "max_new_tokens": 2}
    rec.update(kw)
    return rec


def test_driver_journals_join_the_run_records_once_with_a_partial_line_cut(tmp_path):
    run = tmp_path / "run"
    (run / "records").mkdir(parents=True)
    RecordFiles(run, set()).close()
    a = DriverParts(run, "d0", command="test d0")
    b = DriverParts(run, "d1", command="test d1")
    a.write("candidate-i16.jsonl", _rec("i16-c1/s0/0"))
    b.write("candidate-i16.jsonl", _rec("i16-c1/s1/0", session_id="s1"))
    b.write("reference.jsonl", _rec("ref/h1", role="reference"))
    with pytest.raises(AssertionError, match="written twice"):
        b.write("reference.jsonl", _rec("ref/h1", role="reference"))
    a.close()
    b.close()
    with open(driver_dir(run, "d1") / "candidate-i16.jsonl", "ab") as f:
        f.write(b'{"key": "i16-c1/s9/0", "ro')  # a killed actor's half line
    assert adopt(run) == 3
    assert adopt(run) == 0  # nothing is adopted twice
    assert not (run / "drivers").exists()  # the emptied directories are gone
    files = RecordFiles(run, set())  # builds the adopted sealed directories into parts, as a resume does
    files.close()
    keys = sorted(r["key"] for r in read_lines(run))
    assert keys == ["i16-c1/s0/0", "i16-c1/s1/0", "ref/h1"]
    state = ResumeState.read(run)
    assert set(state.candidates) == {"i16-c1/s0/0", "i16-c1/s1/0"} and set(state.references) == {"h1"}


def test_a_live_driver_lock_is_not_taken_and_a_dead_ones_is(tmp_path):
    run = tmp_path / "run"
    (run / "records").mkdir(parents=True)
    live = DriverParts(run, "d0", command="test")
    live.write("candidate-i16.jsonl", _rec("i16-c1/s0/0"))
    with pytest.raises(RunLocked, match="in use by pid"):
        adopt(run, wait_s=0.1)
    with pytest.raises(RunLocked):
        DriverParts(run, "d0", command="a second writer")  # one writer per driver directory
    # a process that died holding its lock: the lock is stale, its journal is adopted
    proc = subprocess.run([sys.executable, "-c", "import sys; from records.driver_parts import DriverParts; "
                           f"p = DriverParts({str(run)!r}, 'd1', 'dies'); "
                           "p.write('candidate-i16.jsonl', {'key': 'i16-c1/s1/0', 'role': 'candidate'}); "
                           "p._writers['candidate-i16.jsonl']._f.flush(); import os; os._exit(0)"],
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))), timeout=60)
    assert proc.returncode == 0 and (driver_dir(run, "d1") / "writer.lock").exists()
    live.close()
    assert adopt(run, wait_s=0.1) == 2


def test_the_registry_gives_each_input_to_one_server_and_its_answer_to_every_other():
    async def go():
        reg = ReferenceRegistry({"old": RefDone(False, b"x")})
        assert reg.claim(["old", "h", "g"]) == {"old": RefDone(False, b"x"), "h": None, "g": None}  # serve h, g
        assert reg.claim(["h", "g"]) == {"h": True, "g": True}  # another actor serves them: wait
        waiters = [asyncio.ensure_future(reg.wait("h")) for _ in range(3)]
        await asyncio.sleep(0.01)
        assert not any(w.done() for w in waiters)
        reg.report({"h": RefDone(True, b"y")})
        assert await asyncio.gather(*waiters) == [RefDone(True, b"y")] * 3
        assert reg.claim(["h"]) == {"h": RefDone(True, b"y")} and await reg.wait("h") == RefDone(True, b"y")
        assert reg.size() == 2

    asyncio.run(go())


def test_the_heads_progress_adds_what_each_actor_counted():
    from harness.progress import Progress

    p = Progress(10, 2, enabled=False)
    p.add(done=3, errors=1, mismatches=2, retries=1, references=3)
    p.add(done=1)
    assert (p.done, p.errors, p.mismatches, p.retries, p.references) == (6, 1, 2, 1, 3)
    assert "6/10 candidates answered, 3 references, 2 with other tokens" in p.line()
    p.close()


def test_an_actor_that_cannot_see_the_run_directory_says_so(tmp_path):
    from harness.driver_actor import ActorSpec, DriverActor

    actor = DriverActor(ActorSpec(name="d1", run_id="r", run_dir=str(tmp_path / "elsewhere"), candidates=[],
                                  reference=None, sessions={}), registry=None)
    with pytest.raises(FileNotFoundError, match=r"driver actor d1 on .*: the run directory .*elsewhere is not on "
                       "this node .*a filesystem every node shares"):
        asyncio.run(actor.start())
    assert not (tmp_path / "elsewhere").exists()


def test_two_actors_asking_for_the_same_inputs_serve_each_once_in_batched_calls():
    from types import SimpleNamespace

    from harness.shared_refs import SharedReferences

    calls = []

    class Handle:  # the registry as a Ray actor handle reaches it: `await handle.method.remote(...)`
        def __init__(self, reg):
            self.reg = reg

        def __getattr__(self, name):
            async def remote(*args):
                calls.append(name)
                out = getattr(self.reg, name)(*args)
                return await out if asyncio.iscoroutine(out) else out
            return SimpleNamespace(remote=remote)

    class Actor(SharedReferences):
        async def _serve(self, ids, h, max_new, session, turn):
            served.append(h)
            await asyncio.sleep(0.01)
            return RefDone(False, h.encode())

    served: list[str] = []

    async def go():
        handle = Handle(ReferenceRegistry())
        actors = [Actor(None, registry=handle, sender=None, recorder=None, progress=None, concurrency=4)
                  for _ in range(2)]
        hashes = [f"h{k}" for k in range(20)]
        answers = await asyncio.gather(*(a.answer([], h, 1, None, 0) for h in hashes for a in actors))
        for a in actors:
            await a.wait()
        return answers

    answers = asyncio.run(go())
    assert sorted(served) == sorted(f"h{k}" for k in range(20))  # each input served once, by one of the two
    assert answers == [RefDone(False, f"h{k}".encode()) for k in range(20) for _ in range(2)]
    assert calls.count("claim") <= 4 and calls.count("report") <= 4  # batches, not a call per request
