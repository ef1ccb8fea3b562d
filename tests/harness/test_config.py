"""RunConfig from flags and TOML: precedence, validation messages, resume rules, dry-run plans."""

from __future__ import annotations

import json

import pytest

from harness.cli import from_argv
from harness.config import ConfigError
from harness.ray_pools import resolve_address
from harness.resume import for_resume
from harness.run import main
from harness.targets import run_config
from harness.targets.builtin import builtin_plan, server_args
from harness.targets.endpoints import external_plan
from tests.harness.helpers import make_sessions, write_workload


def parse(argv, env=None):
    return from_argv(argv, env or {})


def test_defaults_are_the_frozen_sweep():
    cfg, explicit = parse([])
    assert (cfg.suite, cfg.intervals, cfg.concurrency, cfg.replicas, cfg.block_size) == \
        ("frozen", (128, 256), (1, 4, 8, 16), 1, 8)
    assert cfg.address is None and not cfg.external and explicit == set()


def test_toml_file_then_cli_overrides(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text('suite = "load"\nnum_requests = 64\nintervals = [128]\nconcurrency = "2,4"\n'
                    'replicas = 3\nserver_command = "python -m x --y"\nno_progress = true\nmax_soft_rate = 0.1\n')
    cfg, explicit = parse(["--config", str(toml), "--replicas", "5"])
    assert cfg.suite == "load" and cfg.num_requests == 64 and cfg.intervals == (128,)
    assert cfg.concurrency == (2, 4) and cfg.replicas == 5 and cfg.no_progress and cfg.max_soft_rate == 0.1
    assert cfg.target.server_command == ("python", "-m", "x", "--y")
    assert {"suite", "replicas", "server_command"} <= explicit
    toml.write_text('endpoint = "http://a:1"\nreference_endpoint = ["http://b:2/"]\n')
    cfg, explicit = parse(["--config", str(toml), "--endpoint", "http://c:3"])
    assert cfg.key == "endpoints" and cfg.external
    assert cfg.target.endpoint == ("http://c:3",) and cfg.target.reference_endpoint == ("http://b:2",)


def test_a_setting_of_another_target_is_refused_by_the_chosen_one(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text('endpoint = "http://a:1"\nreference_endpoint = "http://b:2"\nserver_command = "python -m x"\n')
    with pytest.raises(ConfigError, match="^--server-command configures built-in replicas; it does not apply to "
                       "--endpoint servers"):
        parse(["--config", str(toml)])
    with pytest.raises(ConfigError, match=r"^--vllm-python does not apply to this target \(--engine vllm does\)"):
        parse(["--vllm-python", "/usr/bin/python3"])


def test_ray_address_from_environment_unless_given():
    assert parse([], {"RAY_ADDRESS": "10.0.0.1:6379"})[0].address == "10.0.0.1:6379"
    assert parse(["--address", "auto"], {"RAY_ADDRESS": "x:1"})[0].address == "auto"


@pytest.mark.parametrize("argv, message", [
    (["--intervals", "128,abc"], "--intervals: expected comma-separated integers"),
    (["--concurrency", "0,4"], "--concurrency values must be >= 1"),
    (["--concurrency", "4,4"], "--concurrency has repeated values"),
    (["--replicas", "0"], "--replicas must be >= 1"),
    (["--intervals", "4"], "smaller than --block-size 8"),
    (["--page-size", "48"], "interval 128 is not a multiple of --page-size 48"),
    (["--max-soft-rate", "2"], "--max-soft-rate must be in [0, 1]"),
    (["--model-preset", "tiny"], "--model-preset applies to --model-path random only"),
    (["--endpoint", "http://a:1"], "--endpoint needs --reference-endpoint"),
    (["--reference-endpoint", "http://a:1"], "--reference-endpoint needs --endpoint"),
    (["--endpoint", "a:1", "--reference-endpoint", "http://b:1"], "must be http(s)://host:port URLs"),
    (["--run-id", "x/y"], "--run-id must be letters"),
    (["--run-id", "x", "--resume", "runs/y"], "exclude each other"),
    (["--request-timeout", "soon"], "--request-timeout: expected"),
    (["--reference-nice", "20"], "--reference-nice must be in 0..19, got 20"),
    (["--reference-nice", "-1"], "--reference-nice must be in 0..19, got -1"),
    (["--intervals", "100"], r"--intervals (100) must be a multiple of --page-size (16)"),
    (["--model", "/nonexistent"], "--model-path /nonexistent: not 'default', 'random' or a weights directory"),
])
def test_bad_flags_give_clear_errors(argv, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        parse(argv)


@pytest.mark.parametrize("argv", [["--intervals", "100"], ["--model", "/nonexistent"]])
def test_a_bad_value_exits_2_with_one_line_before_anything_starts(argv, capsys, monkeypatch):
    """Caught while the settings are read: no traceback, no Ray, the harness-failed status (never the gate's 1)."""
    import harness.ray_pools

    monkeypatch.setattr(harness.ray_pools.RayPools, "connect", lambda self: pytest.fail("Ray was started"))
    for extra in ([], ["--dry-run"]):
        assert main([*argv, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("specgate: error: ") and len(err.splitlines()) == 1, err


def test_ray_address_resolution():
    assert resolve_address("10.0.0.1:6379") == "10.0.0.1:6379"
    assert resolve_address(None) is None  # a local Ray: a `ray start` cluster is joined with --address auto only


def test_bad_toml_keys_and_types(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text("replica = 2\n")
    with pytest.raises(ConfigError, match="unknown key 'replica'; did you mean replicas\\?"):
        parse(["--config", str(toml)])
    toml.write_text("replicas = true\n")
    with pytest.raises(ConfigError, match="key 'replicas': expected an integer"):
        parse(["--config", str(toml)])
    toml.write_text("replicas = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        parse(["--config", str(toml)])
    with pytest.raises(ConfigError, match="cannot read"):
        parse(["--config", str(tmp_path / "missing.toml")])


def test_unknown_flag_exits_2_with_one_line_and_the_closest_flag(capsys):
    with pytest.raises(SystemExit) as e:
        parse(["--replica", "2"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert err.startswith("specgate: error: unknown flag --replica; did you mean --replicas?")


def test_help_groups_every_flag_and_lists_the_exit_statuses_and_faults():
    from engine.faults import FAULTS
    from harness.cli import GROUPS, build_parser
    from harness.config import RunConfig
    from harness.settings import declared

    grouped = {n for names in GROUPS.values() for n in names}
    assert set(declared(RunConfig)) | {"engine"} == grouped, "every run-wide setting has a --help group"
    text = " ".join(build_parser().format_help().split())
    for title in ("workload:", "sweep:", "target:", "cluster:", "gate:", "output:", "target settings: builtin:"):
        assert title in text
    assert all(f"{status} " in text.split("exit status:")[1] for status in ("0", "1", "2", "3", "130", "143"))
    assert all(name in text.replace("- ", "-") for name in FAULTS)


def test_resume_keeps_the_measurement_and_takes_runtime_settings(tmp_path):
    saved = run_config(intervals=(128,), concurrency=(1, 2), api_key="secret").to_json()
    assert saved["api_key"] == "***"
    given, explicit = parse(["--resume", str(tmp_path / "r1"), "--no-progress", "--intervals", "128"])
    cfg = for_resume(json.loads(json.dumps(saved)), given, explicit, tmp_path / "r1")
    assert cfg.intervals == (128,) and cfg.concurrency == (1, 2) and cfg.no_progress
    assert cfg.run_id == "r1" and cfg.api_key is None and cfg.resume == str(tmp_path / "r1")
    given, explicit = parse(["--resume", str(tmp_path / "r1"), "--concurrency", "4"])
    with pytest.raises(ConfigError, match="--concurrency cannot change on --resume"):
        for_resume(saved, given, explicit, tmp_path / "r1")


def test_server_args_per_pool():
    cfg = run_config(model_path="random", model_preset="tiny", inject_fault="stale-seq-lens", page_size=16)
    plan = builtin_plan(cfg, make_sessions(2) + make_sessions(1, interval=256, prefix="x"))
    cand = server_args(cfg, plan.candidates[0].engine)
    assert cand[cand.index("--mamba-track-interval") + 1] == "128" and "DFLASH" in cand
    assert cand[cand.index("--inject-fault") + 1] == "stale-seq-lens" and "--disable-radix-cache" not in cand
    ref = server_args(cfg, plan.reference.engine)
    assert "--disable-radix-cache" in ref and "NONE" in ref and "--inject-fault" not in ref
    assert [len(p.sessions) for p in plan.candidates] == [2, 3]  # the i256-only session runs on i256 only
    assert plan.total_candidate_requests == (4 + 6) * 4


def test_external_plan_groups_endpoints_by_interval():
    cfg = run_config(endpoint=("http://a", "http://b", "http://c"), reference_endpoint=("http://r",))
    spec = {"speculative_algorithm": "DFLASH", "speculative_num_draft_tokens": 8,
            "mamba_radix_cache_strategy": "extra_buffer"}
    infos = {"http://a": {**spec, "mamba_track_interval": 256}, "http://b": {**spec, "mamba_track_interval": 128},
             "http://c": {**spec, "mamba_track_interval": 256},
             "http://r": {"speculative_algorithm": None, "disable_radix_cache": True}}
    plan = external_plan(cfg, make_sessions(2), infos)
    assert [(p.name, p.endpoints) for p in plan.candidates] == [("i128", ("http://b",)),
                                                                ("i256", ("http://a", "http://c"))]
    infos["http://r"] = {"speculative_algorithm": "NONE"}
    with pytest.raises(ValueError, match="reference endpoint http://r: the oracle must run"):
        external_plan(cfg, [], infos)


def test_dry_run_prints_the_plan(tmp_path, capsys):
    workload = write_workload(tmp_path / "w.jsonl", make_sessions(3))
    rc = main(["--dry-run", "--suite", str(workload), "--replicas", "2", "--concurrency", "1,4",
               "--placement", "SPREAD", "--runs-dir", str(tmp_path / "runs")])
    out = capsys.readouterr().out
    assert rc == 0 and not (tmp_path / "runs").exists()
    assert "pool i128: 2 replica(s)" in out and "pool reference: 1 replica(s)" in out
    assert "strategy SPREAD" in out and "pool i256: 3 sessions, 6 requests per sweep point" in out
    assert "total: 24 candidate requests" in out


def test_bad_suite_and_bad_config_exit_2(tmp_path, capsys):
    assert main(["--suite", str(tmp_path / "nope.jsonl"), "--dry-run"]) == 2
    assert "unknown suite" in capsys.readouterr().err
    assert main(["--resume", str(tmp_path / "nothing")]) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_local_ray_gets_a_cpu_for_every_replica_bundle(monkeypatch):
    """`make run` on a 2-core laptop: 2 candidate pools + 1 reference pool must all be placeable."""
    import harness.ray_pools as cluster
    from harness.targets.builtin import BuiltinTarget

    monkeypatch.setattr(cluster.os, "cpu_count", lambda: 2)
    cfg = run_config(tp_size=2, replicas=2)
    target = BuiltinTarget(cfg)
    pools = cluster.RayPools(cfg, builtin_plan(cfg, []), "t", target.launch)
    # (2 intervals x 2 replicas + 1 reference) x 2 ranks, plus one to spare
    assert pools.local_cpus() == 11
    monkeypatch.setattr(cluster.os, "cpu_count", lambda: 64)
    assert pools.local_cpus() == 64
