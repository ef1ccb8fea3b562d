"""Console progress: the closing summary line and the lines while replicas start (harness/progress.py)."""

from __future__ import annotations

import io
import time
import types

import pytest

from harness.progress import Progress, StartupProgress, wait_all
from harness.sweep import Point, PointCounts


class GetTimeoutError(Exception):
    pass


def fake_ray(ready_per_call: list[int], failed: set = frozenset()):
    """A stand-in for ray's wait/get: call k of wait makes ready_per_call[k] more refs ready."""
    calls = iter(ready_per_call)

    def wait(pending, num_returns, timeout):
        n = next(calls, 0)
        if n == 0:
            time.sleep(timeout)
        return pending[:n], pending[n:]

    def get(refs):
        for r in refs:
            if r in failed:
                raise RuntimeError(f"{r} failed to start")
        return [f"info-{r}" for r in refs]

    return types.SimpleNamespace(wait=wait, get=get, exceptions=types.SimpleNamespace(GetTimeoutError=GetTimeoutError))


def test_startup_lines_count_healthy_replicas(capsys):
    assert wait_all(["a", "b", "c"], 5, "replicas", 0.01, fake_ray([1, 0, 2])) == ["info-a", "info-b", "info-c"]
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(", waited")[0] for line in lines] == ["replicas: 0/3 healthy", "replicas: 1/3 healthy",
                                                              "replicas: 1/3 healthy", "replicas: 3/3 healthy"]


def test_startup_wait_times_out_and_a_failed_replica_raises_at_once(capsys):
    with pytest.raises(GetTimeoutError, match="replicas: 2 of 2 not ready in 0.05s"):
        wait_all(["a", "b"], 0.05, "replicas", 0.02, fake_ray([]))
    with pytest.raises(RuntimeError, match="b failed to start"):
        wait_all(["a", "b", "c"], 5, "replicas", 0.01, fake_ray([2, 1], failed={"b"}))
    assert capsys.readouterr().err.count("\n") >= 3


def test_startup_line_says_how_long_it_waited():
    out = io.StringIO()
    p = StartupProgress("vllm replicas", 4, out)
    assert p.update(1, now=p.t0 + 61.4) == "vllm replicas: 1/4 healthy, waited 61s"
    assert out.getvalue() == "vllm replicas: 1/4 healthy, waited 61s\n"


def test_point_lines_and_summary_add_up(capsys):
    progress = Progress(0, 2, enabled=False)
    progress.point("i128", Point(concurrency=4), PointCounts(planned=6, sent=5, answered=4, failed=1, skipped=1,
                                                             wall_s=1.0))
    progress.point("i128", Point(rate=2.0, arrival="poisson"),
                   PointCounts(planned=6, sent=2, answered=2, unsent=4, warmup=3, stopped="reached --duration 1s"))
    out = capsys.readouterr().out.splitlines()
    assert out == ["i128 c=4: 5 sent, 4 answered, 1 failed, 1 skipped (an earlier turn failed) in 1.0s",
                   "i128 rate=2/s poisson: 2 sent, 2 answered, 0 failed, 0 skipped (an earlier turn failed) in 0.0s; "
                   "warmup 3 sent (0 failed), not gated; stopped early (reached --duration 1s): 4 not sent"]
    assert progress.summary() == (
        "candidates: 2 recorded; this process sent 7 (6 answered, 1 failed), skipped 1 (an earlier turn failed), "
        "left 4 unsent (points stopped early); 3 warmup requests (not gated); 0 mismatches (output ids differ "
        "from the reference), 0 retries")


def test_without_a_live_bar_a_line_of_the_counters_comes_every_heartbeat(capsys):
    """Off a terminal (a CI log) the counters are printed on a timer, so a long sweep point never looks hung."""
    import time

    progress = Progress(total=10, initial=2, enabled=False, heartbeat=0.05)
    progress.candidate({"error": None})
    progress.mismatch()
    time.sleep(0.3)
    progress.close()
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("progress ")]
    assert len(lines) >= 2
    assert "3/10 candidates answered" in lines[-1] and "1 with other tokens than their reference" in lines[-1]
    time.sleep(0.15)
    assert not capsys.readouterr().out  # closed: no more lines


def test_a_live_bar_prints_no_heartbeat(capsys):
    import time

    progress = Progress(total=10, initial=0, enabled=True, heartbeat=0.05)
    time.sleep(0.2)
    progress.close()
    assert "progress " not in capsys.readouterr().out
