"""benchmarks/fault_matrix.py's per-sweep-point column: the affected turns flagged at each pool and concurrency,
and what was flagged outside them, so that "every turn at every concurrency" can be read off the table."""

import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from fault_matrix import per_point  # noqa: E402


def test_each_sweep_point_counts_its_own_turns():
    df = pd.DataFrame({"pool": ["i128"] * 4 + ["i256"] * 3, "concurrency": [1, 1, 4, 4, 1, 1, 1],
                       "key": ["a", "b", "c", "d", "e", "f", "g"]})
    hit = {"a", "c", "d", "e"}
    flagged = {"a", "c", "e", "g"}  # d missed at i128 c4; g flagged outside at i256 c1
    assert per_point(df, flagged, hit) == "i128 c1 1/1, i128 c4 1/2, i256 c1 1/1 +1"


def test_one_sweep_point_needs_no_column():
    df = pd.DataFrame({"pool": ["i128", "i128"], "concurrency": [4, 4], "key": ["a", "b"]})
    assert per_point(df, {"a"}, {"a"}) == ""


def test_a_run_without_records_is_named_and_fails_the_script(tmp_path, monkeypatch, capsys):
    import fault_matrix

    def refused(runs, run_id, args, reuse):  # harness.run refused: its run directory holds no records
        (runs / run_id).mkdir(parents=True, exist_ok=True)
        return 2, 0.0

    monkeypatch.setattr(fault_matrix, "run", refused)
    code = fault_matrix.main(["--runs-dir", str(tmp_path), "--no-fp32", "--faults", "stale-seq-lens"])
    err = capsys.readouterr().err
    assert code == 1
    assert "bf16 stale-seq-lens: exit 2" in err and "has no summary.md" in err
    assert "no figures for bf16-clean, bf16-stale-seq-lens" in err
