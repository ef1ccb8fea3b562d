"""A fifth kind of target is one module (stub_target.py) and its tests: registered here, it gets its flags, its
validation, its place in `--help` and in config.json, and runs end to end through `python -m harness.run`, with no
edit anywhere else in the project."""

from __future__ import annotations

import json

import pytest

from harness.cli import build_parser, from_argv
from harness.config import ConfigError
from harness.run import main
from harness.targets import TARGETS, engines, register, unregister
from reports.gate import EXIT_GATE_FAILED, EXIT_HARNESS_FAILED
from tests.harness.helpers import make_sessions, write_workload
from tests.harness.targets.stub_target import StubTarget


@pytest.fixture
def stub():
    register(StubTarget)
    try:
        yield StubTarget
    finally:
        unregister(StubTarget.key)
    assert "stub" not in TARGETS


def stub_args(tmp_path, *extra: str) -> list[str]:
    workload = write_workload(tmp_path / "w.jsonl", make_sessions(4, turns=2, prompt_len=20, max_new=8))
    return ["--engine", "stub", "--suite", str(workload), "--intervals", "16", "--block-size", "4",
            "--concurrency", "1,2", "--runs-dir", str(tmp_path / "runs"), "--no-progress", "--min-coverage", "0",
            "--request-timeout", "30", *extra]


def test_registering_a_target_gives_it_an_engine_value_flags_and_validation(stub, tmp_path):
    assert "stub" in engines()
    help_text = build_parser().format_help()
    assert "--stub-fault" in help_text and "{builtin,vllm,sglang,stub}" in help_text
    cfg, _ = from_argv(["--engine", "stub", "--stub-fault", "shift-restored"], {})
    assert cfg.key == "stub" and cfg.target.stub_fault == "shift-restored" and not cfg.target.noisy
    with pytest.raises(ConfigError, match="^--stub-fault must be one of shift-restored, got 'x'"):
        from_argv(["--engine", "stub", "--stub-fault", "x"], {})
    with pytest.raises(ConfigError, match=r"^--dtype does not apply to this target \(--engine builtin does\)"):
        from_argv(["--engine", "stub", "--dtype", "bfloat16"], {})
    with pytest.raises(ConfigError, match=r"^--stub-fault does not apply to this target \(--engine stub does\)"):
        from_argv(["--stub-fault", "shift-restored"], {})


def test_the_new_target_runs_end_to_end_and_its_fault_fails_the_gate(stub, tmp_path, capsys):
    clean = main(stub_args(tmp_path, "--run-id", "clean"))
    assert clean not in (EXIT_GATE_FAILED, EXIT_HARNESS_FAILED), capsys.readouterr()
    config = json.loads((tmp_path / "runs" / "clean" / "config.json").read_text())
    assert config["run_config"]["target"] == "stub" and config["target"]["noisy"] is False
    assert config["run_config"]["engine"] == "stub"
    assert main(stub_args(tmp_path, "--run-id", "faulty", "--stub-fault", "shift-restored")) == EXIT_GATE_FAILED
    out = capsys.readouterr().out
    assert "FAIL" in out and "hard" in out
    # a resume of the finished run plans the same target from its config.json and gives the same verdict
    resumed = main(["--resume", str(tmp_path / "runs" / "faulty"), "--engine", "stub", "--no-progress"])
    assert resumed == EXIT_GATE_FAILED, capsys.readouterr()
