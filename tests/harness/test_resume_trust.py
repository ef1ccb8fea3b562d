"""`--resume` never runs what a run directory says (issue 18, finding 6): the server command and the Ray
address come from the current command line; `--trust-run-config` takes the stored ones and shows them; a
tampered config.json cannot make a resume execute its command. Also: an unwritable --runs-dir is a
one-line error, and --dry-run prints each pool's full server command (never an API key)."""

from __future__ import annotations

import json
import shlex
import sys

import pytest

from harness.config import RunConfig
from harness.run import main
from tests.harness.helpers import make_sessions, write_workload

FAKE = f"{sys.executable} -m tests.harness.fake_server"


@pytest.fixture
def tampered(tmp_path):
    """A run directory whose config.json an attacker edited: its server command would create MARKER."""
    workload = write_workload(tmp_path / "w.jsonl", make_sessions(2))
    marker = tmp_path / "MARKER"
    saved = RunConfig(suite=str(workload), intervals=(16,), block_size=4, concurrency=(1,),
                      server_command=tuple(shlex.split(FAKE))).to_json()
    saved["server_command"] = ["sh", "-c", f"touch {marker}"]
    saved["address"] = "evil.example:6379"
    run_dir = tmp_path / "runs" / "r1"
    (run_dir / "records").mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps({"run_id": "r1", "run_config": saved}))
    return run_dir, marker


def test_resume_refuses_a_stored_command_and_runs_nothing(tampered, capsys):
    run_dir, marker = tampered
    assert main(["--resume", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "a resume never runs a command stored in a run directory" in err and f"touch {marker}" in err
    assert "--trust-run-config" in err
    assert main(["--resume", str(run_dir), "--server-command", FAKE]) == 2  # and it cannot be swapped in silently
    assert "--server-command cannot change on --resume" in capsys.readouterr().err
    assert not marker.exists()


def test_trust_run_config_shows_the_stored_command_and_dry_run_runs_nothing(tampered, capsys):
    run_dir, marker = tampered
    assert main(["--resume", str(run_dir), "--trust-run-config", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"running the server command stored in {run_dir / 'config.json'}: sh -c 'touch {marker}'" in out
    assert f"server: sh -c 'touch {marker}' --model-path default" in out  # the plan shows what would run
    assert "evil.example" in out  # trusted: the stored address too
    assert not marker.exists()


def test_resume_takes_the_address_from_this_command_line(tampered, capsys, monkeypatch):
    run_dir, marker = tampered
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert main(["--resume", str(run_dir), "--dry-run", "--server-command", "sh -c 'touch " + str(marker) + "'"]) == 0
    out = capsys.readouterr().out
    assert "evil.example" not in out and "a local Ray" in out
    assert not marker.exists()  # --dry-run prints the command, never runs it


def test_dry_run_prints_the_full_server_command_without_the_key(tmp_path, capsys):
    workload = write_workload(tmp_path / "w.jsonl", make_sessions(1))
    assert main(["--suite", str(workload), "--intervals", "16", "--block-size", "4", "--api-key", "sekrit-123",
                 "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "server: python -m engine.serve --model-path default --tp-size 1 --speculative-algorithm DFLASH" in out
    servers = [line for line in out.splitlines() if line.strip().startswith("server:")]
    assert len(servers) == 2 and all("--host HOST --port PORT" in x and "--api-key" not in x for x in servers)
    assert "sekrit-123" not in out
    assert "passed in their environment" in out


def test_an_unwritable_runs_dir_is_a_clear_error(tmp_path, capsys):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")  # even root cannot make a directory inside a file
    workload = write_workload(tmp_path / "w.jsonl", make_sessions(1))
    assert main(["--suite", str(workload), "--intervals", "16", "--block-size", "4",
                 "--runs-dir", str(blocker / "runs")]) == 2
    err = capsys.readouterr().err
    assert "cannot write the run directory" in err and "--runs-dir" in err and "Traceback" not in err
