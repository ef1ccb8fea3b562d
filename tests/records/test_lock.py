"""One writer per run directory: a live holder refuses the next, a dead one's lock is taken over, once."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from records.lock import LOCK_FILE, RunLock, RunLocked, holder_alive, process_start

REPO = Path(__file__).resolve().parents[2]


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def write_lock(run_dir: Path, **holder) -> dict:
    info = {"pid": dead_pid(), "host": socket.gethostname(), "command": "python -m harness.run --resume x",
            "since": "2026-01-01T00:00:00Z", "start_time": 12345, **holder}
    (run_dir / LOCK_FILE).write_text(json.dumps(info))
    return info


def test_the_lock_names_its_holder_and_refuses_a_second_writer(tmp_path):
    with RunLock.acquire(tmp_path, command="python -m harness.run --run-id a") as lock:
        held = json.loads((tmp_path / LOCK_FILE).read_text())
        assert held == lock.holder and lock.taken_over is None
        assert (held["pid"], held["host"], held["command"]) == (os.getpid(), socket.gethostname(),
                                                                "python -m harness.run --run-id a")
        assert held["start_time"] == process_start(os.getpid()) and held["since"].endswith("Z")
        with pytest.raises(RunLocked) as e:
            RunLock.acquire(tmp_path)  # a second writer, even in the same process
        msg = str(e.value)
        assert f"pid {os.getpid()} on host {socket.gethostname()}" in msg and held["since"] in msg
        assert "python -m harness.run --run-id a" in msg and e.value.holder == held
    assert not (tmp_path / LOCK_FILE).exists()  # released on leaving the block
    RunLock.acquire(tmp_path).release()


def test_a_live_holder_in_another_process_is_refused(tmp_path):
    code = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from records.lock import RunLock
        lock = RunLock.acquire({str(tmp_path)!r}, command="holder")
        print("held", flush=True)
        sys.stdin.read()
        lock.release()
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "held\n"
        with pytest.raises(RunLocked, match=f"in use by pid {p.pid} on host .* \\(command: holder\\)"):
            RunLock.acquire(tmp_path)
    finally:
        p.communicate("")
    assert p.returncode == 0 and not (tmp_path / LOCK_FILE).exists()


def test_the_lock_of_a_killed_process_is_taken_over(tmp_path):
    code = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(REPO)!r})
        from records.lock import RunLock
        RunLock.acquire({str(tmp_path)!r}, command="killed")
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    p = subprocess.Popen([sys.executable, "-c", code])
    assert p.wait() == -signal.SIGKILL
    stale = json.loads((tmp_path / LOCK_FILE).read_text())
    assert stale["pid"] == p.pid and not holder_alive(stale)
    lock = RunLock.acquire(tmp_path)
    assert lock.taken_over == stale and json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()


def test_a_reused_pid_is_stale(tmp_path):
    """The pid runs (it is this process) but started at another time than the lock says: the holder is gone."""
    stale = write_lock(tmp_path, pid=os.getpid(), start_time=process_start(os.getpid()) + 1)
    lock = RunLock.acquire(tmp_path)
    assert lock.taken_over == stale
    lock.release()


def test_a_lock_from_another_host_is_never_taken_over(tmp_path):
    write_lock(tmp_path, host="other-node", pid=1)
    with pytest.raises(RunLocked, match=f"on host other-node .*if that process is gone, remove {tmp_path}/{LOCK_FILE}"):
        RunLock.acquire(tmp_path)


def test_an_unreadable_lock_is_refused_with_what_to_do(tmp_path):
    (tmp_path / LOCK_FILE).write_text("{half")
    with pytest.raises(RunLocked, match="cannot be read .*remove it if no run or resume is using this directory"):
        RunLock.acquire(tmp_path)


def test_release_leaves_a_lock_that_is_no_longer_ours(tmp_path):
    lock = RunLock.acquire(tmp_path)
    other = write_lock(tmp_path)  # as if another process had taken it over
    lock.release()
    assert json.loads((tmp_path / LOCK_FILE).read_text()) == other


def _race(run_dir: str, barrier, results, done) -> None:
    import time

    take_over = RunLock._take_over

    def late(*a):  # every racer has judged the lock stale before any of them replaces it
        time.sleep(0.3)
        return take_over(*a)

    RunLock._take_over = staticmethod(late)
    barrier.wait()
    try:
        lock = RunLock.acquire(run_dir)
    except RunLocked as e:
        results.put(("refused", e.holder["pid"]))
        return
    results.put(("won", os.getpid()))  # by takeover, or by a free lock in the instant a takeover had cleared it
    done.wait()  # keep holding until every racer has answered
    lock.release()


@pytest.mark.parametrize("round_", range(2))
def test_racing_takeovers_of_a_stale_lock_have_one_winner(tmp_path, round_):
    write_lock(tmp_path)
    ctx = multiprocessing.get_context("spawn")
    n = 6
    barrier, results, done = ctx.Barrier(n), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_race, args=(str(tmp_path), barrier, results, done)) for _ in range(n)]
    for p in procs:
        p.start()
    got = [results.get(timeout=60) for _ in range(n)]
    done.set()
    for p in procs:
        p.join(timeout=60)
    winners = [pid for what, pid in got if what == "won"]
    assert len(winners) == 1 and winners[0] in {p.pid for p in procs}
    assert sorted(pid for what, pid in got if what == "refused") == [winners[0]] * (n - 1)
    assert not (tmp_path / LOCK_FILE).exists()
