"""A benign control through Ray: a deliberately poor drafter under memory pressure raises no false alarm.

Speculative decoding is lossless whatever the drafts, and evicting checkpoints or KV only costs
cache hits: with the scripted drafter proposing only wrong tokens (`--scripted-accept 0`, so every
verify step commits just the bonus token) and a linear-state pool too small to keep every
checkpoint (`--max-state-slots`), the trained model's outputs stay identical to the cold path, the
accept length drops to 1 and checkpoints are evicted. Nothing is flagged (a gate that failed here would
raise false alarms), and the verdict is INCONCLUSIVE, not PASS: with no draft accepted, the speculative
verify path the gate exists for was not exercised (reports/exercised.py). The candidate flags reach the
candidates only (`--candidate-args`).
"""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from records.jsonl import load_run
from workloads import load_suite
from workloads.schema import dumps_jsonl

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
SESSIONS = ("frozen-i128-k1-m3", "frozen-i128-k1-m1", "frozen-i128-k1-p0", "frozen-i128-multi1",
            "frozen-i128-shared-stem", "frozen-i128-shared-ckpt", "frozen-i128-shared-page", "frozen-i128-ctrl1")
ARGS = "--drafter-mode scripted --scripted-accept 0 --max-state-slots 7"


def test_poor_drafter_under_memory_pressure_passes_the_gate(tmp_path):
    suite = tmp_path / "control.jsonl"
    suite.write_text(dumps_jsonl([s for s in load_suite("frozen") if s.session_id in SESSIONS]))
    cmd = [sys.executable, "-m", "harness.run", "--suite", str(suite), "--intervals", "128", "--concurrency", "2",
           "--candidate-args", ARGS, "--runs-dir", str(tmp_path / "runs"), "--run-id", "control", "--no-progress",
           "--num-cpus", "3"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    print(proc.stdout[-3000:], proc.stderr[-3000:])
    assert proc.returncode == 3, "INCONCLUSIVE: nothing flagged, but no draft token accepted"
    assert "not exercised: pool i128: no draft token was accepted" in proc.stdout
    assert "INCONCLUSIVE: 0 hard mismatches, 0 drift" in proc.stdout
    run_dir = tmp_path / "runs" / "control"
    df = pd.read_csv(run_dir / "requests.csv")
    assert len(df) == 2 * len(SESSIONS) and set(df["class"]) == {"exact"}
    cands = load_run(run_dir).candidates
    assert all(r["engine"]["args"] == ARGS.split() for r in cands)
    # every draft rejected: each verify step commits the bonus token only (the first token is prefill's)
    assert {commit for r in cands for _, commit, _ in r["spec_trace"]} == {1}
    configs = pd.read_csv(run_dir / "configs.csv")
    assert configs.loc[0, "accept_length_mean"] < 1.1  # the trained drafter reaches ~3.3 on this suite
    assert int(configs.loc[0, "checkpoint_evictions"]) > 0
    pools = json.loads((run_dir / "config.json").read_text())["pools"]
    assert pools["i128"]["server_info"]["max_state_slots"] == 7
    assert pools["reference"]["server_info"]["max_state_slots"] == 0  # the cold path keeps its defaults
