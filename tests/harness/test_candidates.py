"""--candidate-args, --diagnose and --cover: parsing, validation, the pools they plan, the dry run."""

from __future__ import annotations

import pytest

from harness.cli import from_argv
from harness.config import ConfigError
from harness.engine_args import EngineArgsError, engine_overrides
from harness.run import main
from harness.targets import run_config
from harness.targets.builtin import builtin_plan, engine_config, server_args
from tests.harness.helpers import make_sessions


def parse(argv):
    return from_argv(argv, {})[0]


def test_engine_overrides_are_parsed_by_engine_serve():
    assert engine_overrides(()) == {}
    assert engine_overrides(("--max-state-slots", "12", "--max-total-tokens=4096")) == {
        "max_state_slots": 12, "max_total_tokens": 4096}
    assert engine_overrides(("--drafter-mode", "scripted", "--scripted-accept", "-1")) == {
        "drafter_mode": "scripted", "scripted_accept": -1}


def test_a_candidate_may_turn_its_radix_cache_off():
    # accepted (issue 26): such a candidate exercises no restore, and its run ends INCONCLUSIVE (reports/exercised.py)
    assert engine_overrides(("--disable-radix-cache",)) == {"disable_radix_cache": True}


@pytest.mark.parametrize("args, message", [
    ("--max-state-slotz 3", "unrecognized arguments: --max-state-slotz 3"),
    ("--max-state-slots x", "argument --max-state-slots: invalid int value: 'x'"),
    ("--drafter-mode magic", "argument --drafter-mode: invalid choice: 'magic'"),
    ("--port 5", "--port is set by the harness for each replica"),
    ("--mamba-track-interval 64", "--mamba-track-interval is set by the harness for each pool; use the harness "
                                  "flag --intervals"),
    ("--inject-fault stale-seq-lens", "use the harness flag --inject-fault"),
    ("--help", "--help is not an engine setting"),
])
def test_bad_engine_flags_name_the_flag(args, message):
    with pytest.raises(EngineArgsError, match=message.replace("(", r"\(")):
        engine_overrides(tuple(args.split()))


@pytest.mark.parametrize("argv, message", [
    (["--candidate-args", "--max-state-slots 2"], "--max-state-slots 2 cannot hold one request"),
    (["--candidate-args", "--max-total-tokens 0"], "--candidate-args: --max-total-tokens must be >= 1, got 0"),
    (["--candidate-args", "--nope 1"], "--candidate-args: unrecognized arguments: --nope 1"),
    (["--cover", "--suite", "load"], "--cover runs its own suite"),
    (["--cover", "--candidate-args", "--scripted-accept 3"], "--cover sets --drafter-mode scripted"),
    (["--diagnose", "--endpoint", "http://a:1", "--reference-endpoint", "http://b:1"],
     "--diagnose configures built-in replicas"),
    (["--drift-tolerance", "-1"], "--drift-tolerance must be >= 0"),
    (["--max-drift", "-1"], "--max-drift must be >= 0"),
])
def test_bad_candidate_settings_are_config_errors(argv, message):
    with pytest.raises(ConfigError, match=message):
        parse(argv)


def test_cover_with_too_small_an_interval_fails_at_load(capsys):
    assert main(["--cover", "--intervals", "32", "--dry-run"]) == 2
    assert "--cover: interval 32 is too small for the cover suite" in capsys.readouterr().err


def test_candidate_args_reach_candidate_pools_only():
    cfg = run_config(candidate_args=("--max-state-slots", "9"), model_path="random", model_preset="tiny")
    plan = builtin_plan(cfg, make_sessions(2))
    for p in plan.candidates:
        assert engine_config(cfg, p.engine).max_state_slots == 9
        assert p.engine.args == ("--max-state-slots", "9") and p.engine.record()["args"] == ["--max-state-slots", "9"]
        argv = server_args(cfg, p.engine)
        assert argv[argv.index("--max-state-slots") + 1] == "9"
    assert engine_config(cfg, plan.reference.engine).max_state_slots == 0
    assert "--max-state-slots" not in server_args(cfg, plan.reference.engine)


def test_diagnose_adds_a_speculation_only_and_a_cache_only_pool_per_interval():
    cfg = run_config(diagnose=True, inject_fault="insert-working-state")
    plan = builtin_plan(cfg, make_sessions(2))
    assert [p.name for p in plan.candidates] == ["i128", "i128-spec", "i128-cache", "i256", "i256-spec",
                                                 "i256-cache"]
    got = {p.name: (e.speculative_algorithm, e.disable_radix_cache, e.mamba_track_interval, e.inject_fault)
           for p in plan.candidates for e in [engine_config(cfg, p.engine)]}
    assert got["i128"] == ("DFLASH", False, 128, "insert-working-state")
    assert got["i128-spec"] == ("DFLASH", True, 128, "insert-working-state")
    assert got["i256-cache"] == ("NONE", False, 256, "insert-working-state")
    assert all(len(p.sessions) == 2 for p in plan.candidates)
    assert plan.total_candidate_requests == 6 * 4 * 4
    assert "--diagnose" not in " ".join(server_args(cfg, plan.reference.engine))


def test_cover_uses_the_scripted_drafter_and_its_own_suite(capsys):
    cfg = parse(["--cover", "--candidate-args", "--max-state-slots 40"])
    assert cfg.workload == "cover"
    assert cfg.target.candidate_engine_args == ("--drafter-mode", "scripted", "--scripted-accept", "-1",
                                         "--max-state-slots", "40")
    assert main(["--cover", "--intervals", "128", "--concurrency", "4", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "suite cover: 36 session runs per sweep point" in out
    assert "engine args --drafter-mode scripted --scripted-accept -1" in out
    assert "pool i128: 36 sessions, 72 requests per sweep point, concurrency 4" in out


def test_drift_tolerance_is_per_target():
    assert run_config().gate.drift_tolerance == 1e-3
    assert run_config(drift_tolerance=0.01).gate.drift_tolerance == 0.01
    ext = run_config(endpoint=("http://a:1",), reference_endpoint=("http://b:1",))
    assert ext.gate.drift_tolerance == 0.05
    assert run_config(max_drift=3).gate.max_drift == 3


def test_dry_run_shows_the_candidate_args(capsys):
    assert main(["--dry-run", "--diagnose", "--intervals", "128", "--candidate-args=--max-state-slots 12"]) == 0
    out = capsys.readouterr().out
    assert "pool i128-spec: 1 replica(s), tp 1, DFLASH B=8, no radix cache, interval 128, engine args " \
           "--max-state-slots 12" in out
    assert "pool i128-cache: 1 replica(s), tp 1, no speculation, radix extra_buffer, interval 128" in out
    assert out.count("--max-state-slots 12") == 6  # three pools: description and server line each


def test_the_load_suite_targets_the_runs_intervals(capsys):
    assert main(["--dry-run", "--suite", "load", "--num-requests", "64", "--intervals", "256"]) == 0
    out = capsys.readouterr().out
    assert "requests per sweep point" in out and "pool i256" in out and "total: 256 candidate requests" in out
