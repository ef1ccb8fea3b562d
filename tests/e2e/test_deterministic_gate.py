"""--deterministic end to end: the built-in engine in bf16, its deterministic mode asked of every pool.

A few sessions of the frozen suite (turn 0 crosses 128 inside a verify step, turn 1 restores the
checkpoint) through Ray at interval 128 and concurrency 4, with the calibration's controls (coverage not
gated: four sessions cross 4 of the 36 boundary cells). Clean: every
pool's servers confirm the mode, every request (controls included) matches the cold path bit for bit
(drift 0), the gated pool is compared exactly, PASS. With `stale-seq-lens` (#37817): FAIL, and every turn
whose record says the fault reached it (`injected_fault_hit`) is flagged: with tolerance 0 even a
bf16 target catches every corrupted restore, not just those that move a log-prob past the noise. Against the
clean run as the trusted run (`--baseline-run`), the paired check pairs the concurrency-4 sweep point, which
batching keeps from pairing outside the mode.
"""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
SESSIONS = ("frozen-i128-k1-m8", "frozen-i128-k1-m5", "frozen-i128-k1-m2", "frozen-i128-k1-m1")
pytestmark = pytest.mark.slow


def _suite(tmp_path: Path) -> Path:
    lines = [line for line in (ROOT / "workloads/data/frozen.jsonl").read_text().splitlines()
             if json.loads(line)["session_id"] in SESSIONS]
    path = tmp_path / "few.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _run(tmp_path: Path, *extra: str):
    cmd = [sys.executable, "-m", "harness.run", "--suite", str(_suite(tmp_path)), "--intervals", "128",
           "--concurrency", "4", "--dtype", "bfloat16", "--deterministic", "--runs-dir", str(tmp_path / "runs"),
           "--no-progress", "--num-cpus", "4", "--min-coverage", "0", *extra]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    print(proc.stdout[-3000:], proc.stderr[-3000:])
    runs = tmp_path / "runs"
    run_dir = max((p for p in runs.iterdir() if p.is_dir() and p.name != "latest"), key=lambda p: p.stat().st_mtime)
    return proc.returncode, run_dir


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> tuple[int, Path]:
    return _run(tmp_path_factory.mktemp("clean"))


def test_clean_deterministic_bf16_run_passes_with_zero_drift_compared_exactly(clean):
    code, run_dir = clean
    assert code == 0
    df = pd.read_csv(run_dir / "requests.csv")
    assert len(df) == 24 and (df["class"] == "exact").all()  # 8 turns per pool: the candidate and two controls
    config = json.loads((run_dir / "config.json").read_text())
    assert set(config["deterministic"]) == {"i128", "ctl-i128-spec", "ctl-i128-cache", "reference"}
    assert set(config["deterministic"].values()) == {"the server reports enable_deterministic_inference: true"}
    cal = config["calibration"]
    assert cal["exact"] == ["i128"] and config["gate"]["drift_tolerance"] == 0
    assert all(p["drift_max"] == 0 and p["flips"] == 0 for p in cal["per_pool"].values())
    assert "Deterministic mode: the run asked every pool" in (run_dir / "summary.md").read_text()
    assert df["drift"].max() == 0 and int(df["cached_tokens"].gt(0).sum()) >= 4  # the turn-1 restores happened


def test_stale_seq_lens_flags_every_turn_it_reached(tmp_path):
    code, run_dir = _run(tmp_path, "--inject-fault", "stale-seq-lens")
    assert code == 1
    df = pd.read_csv(run_dir / "requests.csv")
    hit = df["injected_fault_hit"].fillna(False).astype(bool)
    assert hit.sum() >= 4  # every session's turn 1 restored the checkpoint its verify step never copied
    assert df.loc[hit, "class"].isin(["drift", "hard"]).all()
    assert (df.loc[~hit, "class"] == "exact").all()  # and nothing it did not reach


def test_the_paired_check_pairs_a_concurrent_sweep_point_in_the_mode(clean, tmp_path):
    code, trusted = clean
    assert code == 0
    code, run_dir = _run(tmp_path, "--inject-fault", "stale-seq-lens", "--baseline-run", str(trusted))
    assert code == 1
    summary = (run_dir / "summary.md").read_text()
    assert "1 sweep point(s) served deterministically (every turn that restored nothing equal to its twin bit " \
           "for bit)" in summary and "not paired, their unrestored turns moved" not in summary
    df = pd.read_csv(run_dir / "requests.csv")
    hit = df["injected_fault_hit"].fillna(False).astype(bool)
    assert hit.sum() >= 4 and df.loc[hit, "class"].isin(["drift", "hard"]).all()
    assert (df.loc[~hit, "class"] == "exact").all()
