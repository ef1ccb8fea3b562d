"""The restore window end to end (harness/window.py, reports/window.py): a bf16 restore fault that bf16's own noise
hides in the outputs, caught without a trusted run.

`track-off-by-one` in bf16 moves a restored turn's outputs by no more than bf16 numerics move a clean one: the
output oracle alone flags about a third of the turns it affects (docs/reports.md). The prompt tokens just past the
restored checkpoint move by 0.4 to 6 where clean restores move them by less than 0.1, so the restore window flags
them, and nothing else.
"""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_a_bf16_restore_fault_is_caught_by_the_restore_window(tmp_path):
    cmd = [sys.executable, "-m", "harness.run", "--suite", "frozen", "--dtype", "bfloat16", "--intervals", "128",
           "--concurrency", "4", "--runs-dir", str(tmp_path), "--run-id", "faulty", "--no-progress", "--num-cpus",
           "4", "--inject-fault", "track-off-by-one"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    print(proc.stdout[-3000:], proc.stderr[-3000:])
    assert proc.returncode == 1
    run_dir = tmp_path / "faulty"
    df = pd.read_csv(run_dir / "requests.csv")
    gated = df[~df["pool"].str.startswith("ctl-")]
    flagged = set(gated.loc[gated["class"].isin(["drift", "hard"]), "key"])
    affected = set(gated.loc[gated["restored_verify_crossed"].fillna(False).astype(bool), "key"])
    assert len(affected) == 30 and flagged <= affected  # nothing outside the turns the fault hurt
    assert len(flagged) >= 27  # measured 28 (the other two moved by 0.027 and 0.032: as much as clean numerics)
    windowed = set(gated.loc[gated["window_status"] == "flagged", "key"])
    assert windowed <= affected and len(windowed) >= 27
    restored = gated[gated["restored"]]
    assert set(restored["window_status"]) <= {"compared", "flagged"}  # every restored turn's window compared
    cache = df[df["pool"] == "ctl-i128-cache"]
    assert (cache["window_status"] == "compared").sum() == cache["restored"].sum() > 0  # the control's, unflagged
    summary = (run_dir / "summary.md").read_text()
    assert f"Restore windows: pool i128: {len(restored)} of {len(restored)} restored turn(s) compared" in summary
