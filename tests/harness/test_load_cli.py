"""The load flags through `python -m harness.run` against external fake servers (no Ray): a Poisson rate point
beside a concurrency point, warmup, --duration, --slo, and the per-point console lines and configs.csv."""

from __future__ import annotations

import pandas as pd
import pytest

from harness.run import main
from records.jsonl import load_run
from records.reader import RunReader
from tests.harness.helpers import (
    FAKE_SERVER,
    candidate_args,
    make_sessions,
    reference_args,
    server_processes,
    write_workload,
)

pytestmark = pytest.mark.slow


def test_rate_point_warmup_and_slo_through_the_cli(tmp_path, capsys):
    sessions = make_sessions(4)
    workload = write_workload(tmp_path / "w.jsonl", sessions)
    with server_processes(FAKE_SERVER, [candidate_args(16), reference_args()], "fake servers") as (a, r):
        rc = main(["--suite", str(workload), "--endpoint", a, "--reference-endpoint", r, "--concurrency", "2",
                   "--request-rate", "20", "--arrival", "poisson", "--seed", "5", "--warmup", "1",
                   "--slo", "ttft_ms=60000", "--runs-dir", str(tmp_path / "runs"), "--run-id", "load",
                   "--no-progress", "--min-coverage", "0"])  # 8 short turns cross no boundary cell
    out = capsys.readouterr().out
    assert rc == 0
    run_dir = tmp_path / "runs" / "load"
    cands = load_run(run_dir).candidates
    assert sorted(r["key"].split("/")[0] for r in cands) == ["i16-c2"] * 8 + ["i16-r20"] * 8
    assert {r["arrival"] for r in cands if r["request_rate"] == 20.0} == {"poisson"}
    lines = [x for x in out.splitlines() if x.startswith("i16 ")]
    assert len(lines) == 2
    assert lines[0].startswith("i16 c=2: 8 sent, 8 answered, 0 failed, 0 skipped (an earlier turn failed) in ")
    assert lines[1].startswith("i16 rate=20/s poisson: 8 sent, 8 answered, 0 failed, 0 skipped")
    assert lines[0].endswith("; warmup 1 sent (0 failed), not gated")
    assert ("candidates: 16 recorded; this process sent 16 (16 answered, 0 failed), skipped 0 (an earlier turn "
            "failed); 2 warmup requests (not gated); 0 mismatches") in out
    configs = pd.read_csv(run_dir / "configs.csv").set_index("point")
    assert list(configs.index) == ["c2", "r20"] and configs.loc["r20", "offered_rps"] == 20.0
    assert (configs["slo_attainment"] == 1.0).all() and (configs["slo"] == "ttft_ms=60000").all()
    assert (configs["warmup"] == 1).all()
    assert {p["point"] for p in RunReader(run_dir).records("points")} == {"c2", "r20"}


def test_duration_leaves_the_rest_unsent_and_the_gate_judges_what_was_sent(tmp_path, capsys):
    sessions = make_sessions(6)
    workload = write_workload(tmp_path / "w.jsonl", sessions)
    with server_processes(FAKE_SERVER, [candidate_args(16), reference_args()], "fake servers") as (a, r):
        rc = main(["--suite", str(workload), "--endpoint", a, "--reference-endpoint", r, "--concurrency", "1",
                   "--request-rate", "2", "--duration", "1.2", "--runs-dir", str(tmp_path / "runs"),
                   "--run-id", "dur", "--no-progress", "--min-coverage", "0"])  # short turns: no boundary cell
    out = capsys.readouterr().out
    assert rc == 0  # unsent requests are no errors
    assert "i16 rate=2/s constant: 3 sent, 3 answered" in out
    assert out.count("stopped early (reached --duration 1.2s): 9 not sent") == 1
    configs = pd.read_csv(tmp_path / "runs" / "dur" / "configs.csv").set_index("point")
    assert configs.loc["r2", "unsent"] == 9 and configs.loc["r2", "stopped"] == "reached --duration 1.2s"
    assert configs.loc["r2", "requests"] == 3
