"""The paired check end to end (reports/paired.py): a bf16 fault that bf16's own noise hides from the controls'
limits, caught against a trusted run of the same command.

`track-off-by-one` in bf16 moves a restored turn's outputs by no more than bf16 numerics move a clean one: the
output oracle flags about a third of the turns it affects, their restore windows (reports/window.py) all but the
two whose prompt moved as little as clean numerics (docs/reports.md). At concurrency 1 the
built-in engine is deterministic, so every turn that restored nothing equals its trusted twin bit for bit and every
restore the fault moved is flagged: exactly the turns that restored a verify-crossed checkpoint.
"""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _run(runs: Path, run_id: str, *extra) -> tuple[int, Path]:
    cmd = [sys.executable, "-m", "harness.run", "--suite", "frozen", "--dtype", "bfloat16", "--intervals", "128",
           "--concurrency", "1", "--runs-dir", str(runs), "--run-id", run_id, "--no-progress", "--num-cpus", "4",
           *extra]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    print(proc.stdout[-3000:], proc.stderr[-3000:])
    return proc.returncode, runs / run_id


def test_a_bf16_restore_fault_is_caught_against_a_trusted_run(tmp_path):
    code, trusted = _run(tmp_path, "trusted")
    assert code == 0
    code, run_dir = _run(tmp_path, "faulty", "--baseline-run", str(trusted), "--inject-fault", "track-off-by-one")
    assert code == 1
    df = pd.read_csv(run_dir / "requests.csv")
    flagged = set(df.loc[df["class"].isin(["drift", "hard"]), "key"])
    affected = set(df.loc[df["restored_verify_crossed"].fillna(False).astype(bool), "key"])
    assert len(affected) == 30 and flagged == affected
    moved = set(df.loc[df["detail"].fillna("").str.startswith("moved from the trusted run"), "key"])
    windowed = set(df.loc[df["window_status"] == "flagged", "key"])
    # most are flagged by their restore window (reports/window.py) before the pairing looks at them; the paired
    # check sees the turns whose window moved as little as clean numerics (measured 2)
    assert len(windowed) >= 25 and moved and moved <= affected - windowed
    summary = (run_dir / "summary.md").read_text()
    assert ("1 sweep point(s) served deterministically (every turn that restored nothing equal to its twin bit for "
            "bit): 37 restored turn(s) judged against their twins, ") in summary
