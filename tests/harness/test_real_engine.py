"""One end-to-end run with the real built-in engine (`python -m engine.serve`, random tiny weights)."""

from __future__ import annotations

import importlib.util

import pytest

from harness.run import main
from tests.harness.helpers import check_complete, make_sessions, write_workload

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("engine.serve") is None, reason="engine.serve not available"),
]


def test_real_engine_run_has_no_hard_mismatch(ray_local, workdir):
    sessions = make_sessions(3, prompt_len=24, max_new=10)
    workload = write_workload(workdir / "w.jsonl", sessions)
    rc = main(["--suite", str(workload), "--model-path", "random", "--model-preset", "tiny",
               "--intervals", "16,32", "--block-size", "4", "--concurrency", "1,2", "--replicas", "1",
               "--runs-dir", str(workdir / "runs"), "--run-id", "real", "--no-progress",
               "--startup-timeout", "120", "--request-timeout", "60",
               "--max-soft-rate", "1"])  # random weights: low-margin numeric flips are allowed, hard ones not
    assert rc == 0
    cands = check_complete(workdir / "runs" / "real", sessions)
    assert all(r["spec_verify_ct"] and r["spec_trace"] is not None for r in cands)
    # turn 1 restored the checkpoint at the boundary below its shared prefix (24 + 10 = 34 tokens)
    assert {r["cached_tokens"] for r in cands if r["turn"] == 1 and r["pool"] == "i16"} == {32}
    assert {r["cached_tokens"] for r in cands if r["turn"] == 1 and r["pool"] == "i32"} == {32}
