"""`--resume` never runs what a run directory says (issue 18, finding 6): the server command and the Ray
address come from the current command line; `--trust-run-config` takes the stored ones and shows them; a
tampered config.json cannot make a resume execute its command. Also: an unwritable --runs-dir is a
one-line error, and --dry-run prints each pool's full server command (never an API key)."""

from __future__ import annotations

import json
import shlex
import sys

import pytest

from harness.run import main
from harness.targets import run_config
from tests.harness.helpers import make_sessions, write_workload

FAKE = f"{sys.executable} -m tests.harness.fake_server"


@pytest.fixture
def tampered(tmp_path):
    """A run directory whose config.json an attacker edited: its server command would create MARKER."""
    workload = write_workload(tmp_path / "w.jsonl", make_sessions(2))
    marker = tmp_path / "MARKER"
    saved = run_config(suite=str(workload), intervals=(16,), block_size=4, concurrency=(1,),
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
    # the plan shows what would run, on GPUs and on CPU (--device auto on a cluster a dry run does not join)
    assert f"server on CPU: sh -c 'touch {marker}' --model-path default" in out
    assert f"server on GPUs: sh -c 'touch {marker}' --model-path default --tp-size 1 --device cuda" in out
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


def tampered_run(tmp_path, **stored) -> tuple:
    """A run directory whose config.json was edited to hold `stored`; the script it names would create MARKER."""
    marker = tmp_path / "MARKER"
    script = tmp_path / "evil.sh"
    script.write_text(f"#!/bin/sh\ntouch {marker}\n")
    script.chmod(0o755)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    workload = write_workload(tmp_path / "w.jsonl", make_sessions(2))
    saved = run_config(suite=str(workload), intervals=(16,), block_size=4, concurrency=(1,)).to_json()
    saved.update({k: (str(script) if v == "SCRIPT" else str(model) if v == "MODEL" else v) for k, v in stored.items()})
    run_dir = tmp_path / "runs" / "r1"
    (run_dir / "records").mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps({"run_id": "r1", "run_config": saved}))
    return run_dir, marker, script, model


def test_a_tampered_engine_and_interpreter_are_refused_naming_both_values(tmp_path, capsys):
    """Issue 27, finding 1: on c76ee7a this resume planned (and without --dry-run ran) the stored script."""
    run_dir, marker, script, model = tampered_run(tmp_path, engine="vllm", vllm_python="SCRIPT",
                                                  model_path="MODEL", backend="openai")
    assert main(["--resume", str(run_dir), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "the run used --engine 'vllm', this command line gives 'builtin'" in err
    assert "give --engine again, or --trust-run-config" in err
    assert main(["--resume", str(run_dir), "--dry-run", "--engine", "vllm", "--model", str(model)]) == 2
    assert f"the run used --vllm-python '{script}', this command line gives None" in capsys.readouterr().err
    assert not marker.exists()


@pytest.mark.parametrize("field, stored, shown", [
    ("model_path", "MODEL", "--model-path '{model}', this command line gives 'default'"),
    ("tokenizer", "MODEL", "--tokenizer '{model}', this command line gives None"),
    ("candidate_args", ["--max-state-slots", "3"], "--candidate-args '--max-state-slots 3', this command line "
                                                   "gives ''"),
    ("sglang_python", "SCRIPT", "--sglang-python '{script}', this command line gives None"),
])
def test_every_setting_that_chooses_what_runs_is_refused_from_the_run_directory(tmp_path, capsys, field, stored,
                                                                                 shown):
    run_dir, marker, script, model = tampered_run(tmp_path, **{field: stored})
    assert main(["--resume", str(run_dir), "--dry-run"]) == 2
    assert "the run used " + shown.format(model=model, script=script) in capsys.readouterr().err
    assert not marker.exists()


def test_trust_run_config_prints_each_stored_choice_before_the_plan(tmp_path, capsys):
    run_dir, marker, script, model = tampered_run(tmp_path, model_path="MODEL",
                                                  candidate_args=["--max-state-slots", "3"])
    main(["--resume", str(run_dir), "--dry-run", "--trust-run-config"])
    out = capsys.readouterr().out.splitlines()
    path = run_dir / "config.json"
    assert out[:3] == [f"--trust-run-config: --engine 'builtin' (from {path})",
                       f"--trust-run-config: --model-path '{model}' (from {path})",
                       f"--trust-run-config: --candidate-args '--max-state-slots 3' (from {path})"]
    assert not marker.exists()


def test_a_changed_workload_setting_is_refused_naming_both_values(tmp_path, capsys):
    run_dir, *_ = tampered_run(tmp_path)
    assert main(["--resume", str(run_dir), "--dry-run", "--seed", "5"]) == 2
    assert "--seed cannot change on --resume (the run used 0; this command line gives 5)" in capsys.readouterr().err
    assert main(["--resume", str(run_dir), "--dry-run", "--endpoint", "http://127.0.0.1:9",
                 "--reference-endpoint", "http://127.0.0.1:9"]) == 2
    assert ("--endpoint cannot change on --resume (the run used []; this command line gives "
            "['http://127.0.0.1:9'])") in capsys.readouterr().err


def test_resume_runs_latest_resolves_the_link(tmp_path, capsys):
    """Issue 27: `--resume runs/latest` was refused with a message about --run-id (c76ee7a)."""
    run_dir, *_ = tampered_run(tmp_path)
    (run_dir.parent / "latest").symlink_to("r1")
    assert main(["--resume", str(run_dir.parent / "latest"), "--dry-run"]) == 0
    assert "pool i16: 2 sessions" in capsys.readouterr().out
