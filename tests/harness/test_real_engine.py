"""One end-to-end run with the real built-in engine (`python -m engine.serve`, random tiny weights)."""

from __future__ import annotations

import json

import pytest

from harness.run import main
from reports.gate import EXIT_INCONCLUSIVE
from tests.harness.helpers import check_complete, make_sessions, write_workload

pytestmark = pytest.mark.slow


def test_real_engine_run_has_no_hard_mismatch(ray_local, workdir):
    sessions = make_sessions(3, prompt_len=24, max_new=10)
    workload = write_workload(workdir / "w.jsonl", sessions)
    rc = main(["--suite", str(workload), "--model-path", "random", "--model-preset", "tiny",
               "--intervals", "16,32", "--block-size", "4", "--concurrency", "1,2", "--replicas", "1",
               "--runs-dir", str(workdir / "runs"), "--run-id", "real", "--no-progress",
               "--startup-timeout", "120", "--request-timeout", "60",
               "--max-soft-rate", "1"])  # random weights: low-margin numeric flips are allowed, hard ones not
    # INCONCLUSIVE (exit 3), not PASS: so few short turns exercise too little (reports/exercised.py)
    assert rc == EXIT_INCONCLUSIVE
    cands = check_complete(workdir / "runs" / "real", sessions)
    assert all(r["spec_verify_ct"] and r["spec_trace"] is not None for r in cands)
    # turn 1 restored the checkpoint at the boundary below its shared prefix (24 + 10 = 34 tokens)
    assert {r["cached_tokens"] for r in cands if r["turn"] == 1 and r["pool"] == "i16"} == {32}
    assert {r["cached_tokens"] for r in cands if r["turn"] == 1 and r["pool"] == "i32"} == {32}


def test_tensor_parallel_replicas_match_single_rank(ray_local, workdir):
    """--tp-size 2: each replica is a server (rank 0) plus a Ray rank actor in its placement group."""
    sessions = make_sessions(2, prompt_len=24, max_new=10)
    workload = write_workload(workdir / "w.jsonl", sessions)
    outputs = {}
    for tp in (1, 2):
        rc = main(["--suite", str(workload), "--model-path", "random", "--model-preset", "tiny",
                   "--intervals", "16", "--block-size", "4", "--concurrency", "1,2", "--tp-size", str(tp),
                   "--runs-dir", str(workdir / "runs"), "--run-id", f"tp{tp}", "--no-progress",
                   "--startup-timeout", "300", "--request-timeout", "120", "--max-soft-rate", "1"])
        # INCONCLUSIVE (exit 3), not PASS: so few short turns exercise too little (reports/exercised.py)
        assert rc == EXIT_INCONCLUSIVE
        cands = check_complete(workdir / "runs" / f"tp{tp}", sessions, intervals=(16,))
        assert {r["engine"]["tp"] for r in cands} == {tp}
        outputs[tp] = {r["key"]: r["output_ids"] for r in cands}
    assert outputs[1] == outputs[2]
    config = json.loads((workdir / "runs" / "tp2" / "config.json").read_text())
    assert config["run_config"]["tp_size"] == 2
