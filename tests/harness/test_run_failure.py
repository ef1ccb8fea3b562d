"""What a harness failure says about its run directory: removed when nothing was recorded, else kept, with the
command that finishes it; never both."""

from __future__ import annotations

import harness.run as run_mod
from harness.run import main
from tests.harness.helpers import make_sessions, run_args


def _crash(records: bool):
    def execute(target, run_dir, run_id, probed=None):
        if records:
            (run_dir / "records" / "part.jsonl").write_text('{"key": "k"}\n')
        raise RuntimeError("boom")
    return execute


def test_a_crash_with_records_keeps_them_and_says_how_to_finish(workdir, capsys, monkeypatch):
    monkeypatch.setattr(run_mod, "execute", _crash(records=True))
    rc = main(run_args(workdir, make_sessions(2), "--run-id", "crashed"))
    err = capsys.readouterr().err
    run_dir = workdir / "runs" / "crashed"
    assert rc == 2 and "RuntimeError: boom" in err and (run_dir / "records" / "part.jsonl").is_file()
    assert err.rstrip().splitlines()[-2:] == [
        "specgate: error: the harness failed",
        f"specgate: records so far are in {run_dir}; finish with: python -m harness.run --resume {run_dir}"]
    assert "removed" not in err


def test_a_crash_before_any_record_removes_the_run_directory_and_says_only_that(workdir, capsys, monkeypatch):
    monkeypatch.setattr(run_mod, "execute", _crash(records=False))
    rc = main(run_args(workdir, make_sessions(2), "--run-id", "crashed"))
    err = capsys.readouterr().err
    run_dir = workdir / "runs" / "crashed"
    assert rc == 2 and not run_dir.exists()
    assert err.rstrip().splitlines()[-2:] == ["specgate: error: the harness failed",
                                              f"specgate: removed {run_dir}: the run recorded nothing"]
    assert "records so far" not in err
