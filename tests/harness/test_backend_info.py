"""Reading SGLang's settings across versions (harness/backends/info.py), table-driven."""

from __future__ import annotations

import pytest

from harness.backends import make_backend, narrowed
from harness.backends.info import block_size_of, candidate_problem, probe_lines, strategy_of, streaming_mode
from harness.targets.endpoints import engine_from_server_info
from tests.harness import server_infos

DFLASH = {"speculative_algorithm": "DFLASH"}


@pytest.mark.parametrize("info,strategy,block", [
    ({**DFLASH, "mamba_radix_cache_strategy": "extra_buffer", "speculative_num_draft_tokens": 8}, "extra_buffer", 8),
    ({**DFLASH, "mamba_scheduler_strategy": "extra_buffer", "speculative_num_draft_tokens": None,
      "speculative_dflash_block_size": 16}, "extra_buffer", 16),
    ({**DFLASH, "mamba_radix_cache_strategy": "extra_buffer_lazy", "mamba_scheduler_strategy": "no_buffer",
      "speculative_dflash_block_size": 4, "speculative_num_draft_tokens": 4}, "extra_buffer_lazy", 4),
    ({"speculative_algorithm": None, "mamba_scheduler_strategy": "no_buffer", "speculative_num_draft_tokens": 8},
     "no_buffer", None),
    ({**DFLASH}, None, None),
])
def test_strategy_and_block_size_under_either_name(info, strategy, block):
    assert strategy_of(info) == strategy and block_size_of(info) == block


def test_plans_never_show_no_block_size_for_a_dflash_server_that_reports_one():
    e = engine_from_server_info(server_infos.older(256, 16), "u")
    assert (e.interval, e.block_size, e.strategy, e.speculative, e.radix_cache) == (256, 16, "extra_buffer", True,
                                                                                     True)


@pytest.mark.parametrize("info,problem", [
    (server_infos.current(256, 8), None),
    (server_infos.current(256, 8, strategy="extra_buffer_lazy"), None),
    (server_infos.older(256, 8), None),
    (server_infos.current(256, 8, strategy="no_buffer"), "runs mamba radix cache strategy 'no_buffer'"),
    (server_infos.current(256, 8, strategy="auto"), "runs mamba radix cache strategy 'auto'"),
    ({**DFLASH, "mamba_track_interval": 256}, "reports no mamba_radix_cache_strategy (nor the older "
                                              "mamba_scheduler_strategy)"),
    ({**server_infos.current(256, 8, strategy="no_buffer"), "disable_radix_cache": True}, None),  # the plan's job
])
def test_candidate_strategy(info, problem):
    got = candidate_problem(info, "http://h:1")
    if problem is None:
        assert got is None
    else:
        assert got.startswith(f"endpoint http://h:1: the candidate {problem}; ")
        assert got.endswith("--mamba-radix-cache-strategy extra_buffer (SGLang builds before mid-2026: "
                            "--mamba-scheduler-strategy extra_buffer)")


def test_streaming_mode_narrowed_and_plan_lines():
    assert streaming_mode(server_infos.current(256, 8, incremental=True)) == "incremental"
    assert streaming_mode(server_infos.older(256, 8)) == "cumulative"
    rec = {"backend": "sglang", "streaming": "incremental", "block_size": 8, "unknown": ["spec_trace"],
           "notes": ["n"]}
    assert probe_lines([{"specgate_probe": rec}, {}]) == [
        "  reports: backend sglang, streaming incremental, block size 8",
        "  not reported (the report narrows): spec_trace", "  note: n"]
    assert narrowed({"i256": {"specgate_probe": rec}, "reference": {}}) == {"i256": ["spec_trace"], "reference": []}
    with pytest.raises(ValueError, match="unknown backend 'grpc'; choose one of sglang, openai"):
        make_backend("grpc")


def test_backend_and_tokenizer_settings():
    from harness.cli import from_argv
    from harness.config import ConfigError
    from harness.targets import run_config

    with pytest.raises(ConfigError, match="--backend openai drives already-running servers: give --endpoint"):
        run_config(backend="openai")
    with pytest.raises(ConfigError, match="--backend must be one of sglang, openai, got 'grpc'"):
        run_config(backend="grpc")
    with pytest.raises(ConfigError, match=r"--tokenizer \./nope\.json: no such file or directory"):
        run_config(tokenizer="./nope.json")
    cfg, explicit = from_argv(["--backend", "openai", "--endpoint", "http://a:1", "--reference-endpoint",
                               "http://b:2", "--tokenizer", "byte"], {})
    assert (cfg.backend, cfg.tokenizer) == ("openai", "byte") and {"backend", "tokenizer"} <= explicit
    assert cfg.to_json()["backend"] == "openai"
