"""`--engine vllm`: the profile's flags, config checks, --dry-run, and runs under Ray with a fake vLLM server
(tests/harness/fake_vllm.py) — a clean candidate passes, a candidate that crashes on requests fails the gate."""

from __future__ import annotations

import json
import shutil

import pytest

from harness.cli import from_argv
from harness.config import ConfigError
from harness.run import main
from harness.targets.venv import InterpreterNotFound, find_python
from harness.targets.vllm import VENV, server_env
from harness.targets.vllm_profile import (
    VLLMArgsError,
    caching_of,
    check_args,
    pools,
    skipped_diagnose_pools,
    spec_config,
    without,
)
from protocol.hf_tokenizer import load_tokenizer
from records.reader import raw_records
from tests.harness.fake_vllm import make_interpreter
from tests.harness.helpers import REPO, make_sessions, write_workload

SPEC = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}'


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "specgate_model.json").write_text(json.dumps({"vllm_args": ["--dtype", "bfloat16"]}))
    # the model's tokenizer, as `harness.models build` writes one: the frozen suite is generated in it
    shutil.copy(REPO / "protocol" / "data" / "byte_tokenizer" / "tokenizer.json", d / "tokenizer.json")
    return d


@pytest.mark.parametrize("suite", ["frozen", "vllm-boundary"])
def test_suites_cut_in_tokens_need_the_model_directorys_tokenizer(model_dir, tmp_path, capsys, suite):
    (model_dir / "tokenizer.json").unlink()
    fake = make_interpreter(tmp_path / "bin")
    assert main(["--engine", "vllm", "--model", str(model_dir), "--vllm-python", fake, "--suite", suite,
                 "--runs-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert f"--suite {suite}: " in err and f"--model {model_dir} holds no tokenizer.json: pass --tokenizer" in err
    assert not (tmp_path / "runs").exists()  # refused before anything was started or written


def test_pools_full_diagnose_and_reference_flags():
    cands, ref = pools(("--speculative-config", SPEC, "--enable-prefix-caching"), diagnose=True)
    assert [(p.name, p.speculative, p.prefix_caching, p.draft_tokens) for p in cands] == [
        ("vllm", True, True, 4), ("vllm-spec", True, False, 4), ("vllm-cache", False, True, None)]
    assert "--no-enable-prefix-caching" in cands[1].args and "--speculative-config" not in cands[2].args
    assert ref.args == ("--no-enable-prefix-caching",) and not ref.speculative and not ref.prefix_caching


def test_diagnose_starts_no_pool_that_repeats_the_candidates_configuration():
    """A candidate without prefix caching is already the speculation-only configuration: --diagnose adds only the
    cache-only half (and says so in the plan); one without speculation drops the cache-only half."""
    spec_only = ("--no-enable-prefix-caching", "--speculative-config", SPEC)
    cands, _ = pools(spec_only, diagnose=True, calibrate=True)
    assert [p.name for p in cands] == ["vllm", "vllm-cache", "baseline"]
    assert skipped_diagnose_pools(spec_only) == [
        "pool vllm-spec not started: the candidate vllm already runs speculation without prefix caching (its "
        "results stand for both in the diagnosis)"]
    cands, _ = pools(("--enable-prefix-caching",), diagnose=True)
    assert [(p.name, p.speculative, p.prefix_caching) for p in cands] == [("vllm", False, True),
                                                                         ("vllm-spec", False, False)]
    assert skipped_diagnose_pools(("--speculative-config", SPEC, "--enable-prefix-caching")) == []


@pytest.mark.parametrize("args, expected", [
    ((), True),  # vLLM's default
    (("--no-enable-prefix-caching",), False),
    (("--no-enable-prefix-caching", "--enable-prefix-caching"), True),
])
def test_caching_follows_the_last_flag(args, expected):
    assert caching_of(args) is expected


def test_spec_config_survives_a_shell_that_ate_its_quotes():
    assert spec_config(("--speculative-config", "{method:ngram,num_speculative_tokens:4,x:true}")) == \
        {"method": "ngram", "num_speculative_tokens": 4, "x": True}
    assert spec_config(("--speculative-config=" + SPEC,))["prompt_lookup_max"] == 4
    with pytest.raises(VLLMArgsError, match="must be a JSON object"):
        spec_config(("--speculative-config", "[1, 2]"))


@pytest.mark.parametrize("flag", ["--port", "--host", "--model", "--served-model-name", "--api-key"])
def test_reserved_flags_are_refused_by_name(flag):
    with pytest.raises(VLLMArgsError, match=f"^{flag} is set by the harness"):
        check_args((flag, "x"))


def test_without_drops_the_flag_and_its_value():
    assert without(("--a", "--speculative-config", SPEC, "--b"), "--speculative-config") == ("--a", "--b")


def test_engine_vllm_implies_the_openai_backend_and_checks_the_model(model_dir, tmp_path):
    cfg, _ = from_argv(["--engine", "vllm", "--model", str(model_dir)], {})
    assert cfg.backend == "openai" and cfg.target.model_path == str(model_dir) and cfg.gate.drift_tolerance == 0.05
    with pytest.raises(ConfigError, match="not a model directory with a config.json"):
        from_argv(["--engine", "vllm", "--model", str(tmp_path / "nope")], {})
    with pytest.raises(ConfigError, match="--inject-fault applies to the built-in engine"):
        from_argv(["--engine", "vllm", "--model", str(model_dir), "--inject-fault", "stale-seq-lens"], {})
    with pytest.raises(ConfigError, match="--candidate-args: --port is set by the harness"):
        from_argv(["--engine", "vllm", "--model", str(model_dir), "--candidate-args", "--port 1"], {})


def test_find_python_says_how_to_get_one(tmp_path):
    with pytest.raises(InterpreterNotFound, match="make vllm"):
        find_python(VENV, str(tmp_path / "missing" / "python"))
    fake = make_interpreter(tmp_path / "bin")
    assert find_python(VENV, None, {"SPECGATE_VLLM_PYTHON": fake}) == fake


def test_server_env_keeps_vllm_local_and_quiet():
    env = server_env("/c", "key", "127.0.0.1")
    assert env["VLLM_HOST_IP"] == "127.0.0.1" and env["VLLM_CACHE_ROOT"] == "/c" and env["VLLM_API_KEY"] == "key"
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_NO_USAGE_STATS"] == "1"


def test_dry_run_shows_every_server_command(model_dir, tmp_path, capsys):
    fake = make_interpreter(tmp_path / "bin")
    rc = main(["--engine", "vllm", "--model", str(model_dir), "--vllm-python", fake, "--diagnose", "--dry-run",
               "--candidate-args", f"--enable-prefix-caching --speculative-config '{SPEC}'"])
    out = capsys.readouterr().out
    assert rc == 0
    servers = [line for line in out.splitlines() if line.startswith("  server: ")]
    # vllm, vllm-spec, vllm-cache (--diagnose), baseline (calibration is automatic for vLLM), reference
    assert len(servers) == 5 and all(f"{fake} -m vllm.entrypoints.openai.api_server --model {model_dir}" in s
                                     for s in servers)
    assert all("--dtype bfloat16" in s and "--enable-prompt-tokens-details" in s for s in servers)
    assert "--no-enable-prefix-caching --host HOST" in servers[-1]  # the reference: neither speculation nor cache
    workload = [line for line in out.splitlines() if "workload:" in line]
    assert len(workload) == 1 and workload[0].startswith("workload: ") and workload[0].count("workload:") == 1
    assert not (tmp_path / "runs").exists()


def test_dry_run_of_a_candidate_without_prefix_caching_starts_no_second_speculation_only_pool(model_dir, tmp_path,
                                                                                               capsys):
    fake = make_interpreter(tmp_path / "bin")
    rc = main(["--engine", "vllm", "--model", str(model_dir), "--vllm-python", fake, "--diagnose", "--dry-run",
               "--candidate-args", f"--no-enable-prefix-caching --speculative-config '{SPEC}'"])
    out = capsys.readouterr().out
    assert rc == 0
    pools = [line.split(" (")[0] for line in out.splitlines() if line.startswith("pool ")]
    assert pools == ["pool vllm", "pool vllm-cache", "pool baseline", "pool reference",
                     "pool vllm-spec not started: the candidate vllm already runs speculation without prefix caching"]
    assert sum(line.startswith("  server: ") for line in out.splitlines()) == 4


def _run(tmp_path, model_dir, sessions, *extra):
    fake = make_interpreter(tmp_path / "bin")
    suite = write_workload(tmp_path / "suite.jsonl", sessions)
    return main(["--engine", "vllm", "--model", str(model_dir), "--vllm-python", fake, "--suite", str(suite),
                 "--candidate-args", f"--enable-prefix-caching --speculative-config '{SPEC}'", "--concurrency",
                 "1,2", "--runs-dir", str(tmp_path / "runs"), "--no-progress", "--startup-timeout", "60",
                 "--recover-timeout", "10", *extra])


@pytest.mark.slow
def test_vllm_replicas_under_ray_pass_and_log_in_the_run_dir(ray_local, workdir, model_dir):
    sessions = make_sessions(3)
    assert _run(workdir, model_dir, sessions, "--run-id", "ok") == 0
    run_dir = workdir / "runs" / "ok"
    config = json.loads((run_dir / "config.json").read_text())
    assert config["pools"]["vllm"]["engine"]["interval"] == 16  # the stub's block, read from /metrics
    assert config["pools"]["vllm"]["engine"]["block_size"] == 5 and config["run_config"]["backend"] == "openai"
    records = raw_records(run_dir)
    # the candidate's turns; vLLM calibrates itself, so a `baseline` pool (the reference's flags) served them too
    assert sum(r["role"] == "candidate" and r["pool"] == "vllm" for r in records) == 3 * 2 * 2
    assert sum(r["role"] == "candidate" and r["pool"] == "baseline" for r in records) == 3 * 2 * 2
    # the workload and the records name the model directory's tokenizer (what decodes their text)
    tok = load_tokenizer(str(model_dir)).name
    assert config["plan"]["tokenizer"] == tok and "tokenizer" in config["plan"]["workload"]
    assert {r["tokenizer"] for r in records if r["role"] in ("candidate", "reference")} == {tok}
    assert sorted(p.name.split("-")[0] for p in (run_dir / "logs").glob("*.log")) == ["baseline", "reference", "vllm"]
    for name in ("vllm", "reference"):
        cache = run_dir.resolve() / "logs" / f"{name}-r0-cache"
        env = json.loads((cache / "fake_vllm_env.json").read_text())
        assert env["VLLM_HOST_IP"] == "127.0.0.1" and env["VLLM_API_KEY"] and env["VLLM_CACHE_ROOT"] == str(cache)
        assert "PYTHONPATH" not in env  # the vLLM venv never sees this project's packages


@pytest.mark.slow
@pytest.mark.parametrize("crash_at", [1, 2])  # 1: on the probe request, before the run writes any record
def test_a_candidate_that_crashes_fails_the_gate_with_its_crash_lines(ray_local, workdir, model_dir, capsys,
                                                                      crash_at):
    (model_dir / "fake_vllm.json").write_text(json.dumps({"crash_at": crash_at}))
    rc = _run(workdir, model_dir, make_sessions(2), "--run-id", "crash", "--max-replica-restarts", "1")
    out = capsys.readouterr().out
    assert rc == 1  # a finding about the candidate, not a harness failure
    assert "RuntimeError: fake engine core died in the speculative verify step" in out
    summary = (workdir / "runs" / "crash" / "summary.md").read_text()
    assert summary.startswith("# specgate crash: **FAIL**")
    assert "  RuntimeError: fake engine core died in the speculative verify step\n" in summary


@pytest.mark.slow
def test_a_candidate_configuration_vllm_refuses_is_a_harness_error_that_says_why(ray_local, workdir, model_dir,
                                                                                  capsys):
    (model_dir / "fake_vllm.json").write_text('{"refuse": "speculative decoding is not supported with this model"}')
    assert _run(workdir, model_dir, make_sessions(1), "--run-id", "refused") == 2  # nothing could be gated
    err = capsys.readouterr().err
    assert "replica vllm-r0: server did not become healthy" in err
    assert "ValueError: speculative decoding is not supported with this model" in err
