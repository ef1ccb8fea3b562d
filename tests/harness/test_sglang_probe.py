"""The SGLang backend against stub servers answering recorded /server_info payloads (older, current, no_buffer,
incremental streaming), an OpenAI-only server, and the rule that a failed probe writes nothing."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from harness.backends import make_backend
from harness.run import main
from records.jsonl import load_run
from reports.gate import EXIT_INCONCLUSIVE
from tests.harness import server_infos
from tests.harness.helpers import candidate_args, make_sessions, reference_args, write_workload
from tests.harness.test_external import servers

pytestmark = pytest.mark.slow
INTERVAL, BLOCK = 16, 4


def run(tmp_path, cand_argv, *extra, sessions=None, run_id="r"):
    """main() against one stub candidate (cand_argv) and a stub reference; returns (rc, urls)."""
    workload = write_workload(tmp_path / "w.jsonl", sessions or make_sessions(2))
    with servers(cand_argv, reference_args()) as (c, r):
        rc = main(["--suite", str(workload), "--endpoint", c, "--reference-endpoint", r, "--concurrency", "1",
                   "--runs-dir", str(tmp_path / "runs"), "--run-id", run_id, "--no-progress", *extra])
    return rc, c


def probe_of(tmp_path, run_id="r", pool=f"i{INTERVAL}") -> dict:
    config = json.loads((tmp_path / "runs" / run_id / "config.json").read_text())
    return config["pools"][pool]["server_info"]["specgate_probe"], config["narrowed"]


def test_older_sglang_only_get_server_info_and_scheduler_strategy(tmp_path, capsys):
    """(a) /get_server_info only, mamba_scheduler_strategy, block size as speculative_dflash_block_size, and
    an older DFlash build's single top logprob: gated, with what it cannot report recorded."""
    payload = server_infos.write(tmp_path / "older.json", server_infos.older(INTERVAL, BLOCK))
    argv = candidate_args(INTERVAL, "--info-paths", "/get_server_info", "--server-info-json", payload,
                          "--top-k-max", "1", "--no-spec-trace")
    rc, _ = run(tmp_path, argv, "--dry-run")
    assert rc == 0 and f"DFLASH B={BLOCK}, radix extra_buffer, interval {INTERVAL}" in capsys.readouterr().out
    sessions = make_sessions(2)
    rc, _ = run(tmp_path, argv, sessions=sessions)
    assert rc == 0
    rec, narrowed = probe_of(tmp_path)
    assert rec["settings_path"] == "/get_server_info" and rec["block_size"] == BLOCK
    assert rec["unknown"] == ["candidate_top_logprobs", "spec_trace"] == narrowed[f"i{INTERVAL}"]
    assert narrowed["reference"] == []
    assert rec["logprobs"] == "chosen token only" and rec["streaming"] == "cumulative"
    assert any("mamba_scheduler_strategy" in n for n in rec["notes"])
    assert any("speculative_dflash_block_size" in n for n in rec["notes"])
    cands = load_run(tmp_path / "runs" / "r").candidates
    assert len(cands) == 4 and all(r["error"] is None for r in cands)
    assert {(r["engine"]["block_size"], r["engine"]["strategy"]) for r in cands} == {(BLOCK, "extra_buffer")}
    assert all(len(t) == 1 for r in cands for t in r["output_top_logprobs"]) and cands[0]["spec_trace"] is None


def test_current_sglang(tmp_path):
    """(b) A current build: /server_info with mamba_radix_cache_strategy; nothing narrowed."""
    payload = server_infos.write(tmp_path / "current.json", server_infos.current(INTERVAL, BLOCK))
    sessions = make_sessions(2)
    rc, _ = run(tmp_path, candidate_args(INTERVAL, "--info-paths", "/server_info,/get_server_info",
                                         "--server-info-json", payload), sessions=sessions)
    # INCONCLUSIVE (exit 3), not PASS: so few short turns exercise too little (reports/exercised.py)
    assert rc == EXIT_INCONCLUSIVE
    rec, narrowed = probe_of(tmp_path)
    assert rec["settings_path"] == "/server_info" and rec["unknown"] == [] and rec["notes"] == []
    assert narrowed == {f"i{INTERVAL}": [], "reference": []} and rec["logprobs"] == "top-2"


def test_no_buffer_candidate_is_refused_and_nothing_is_written(tmp_path, capsys):
    """(c) A no_buffer candidate: exit 2 naming the flag; no run directory; runs/latest still the old run."""
    payload = server_infos.write(tmp_path / "nb.json", server_infos.current(INTERVAL, BLOCK, strategy="no_buffer"))
    argv = candidate_args(INTERVAL, "--info-paths", "/server_info", "--server-info-json", payload)
    (tmp_path / "runs" / "old").mkdir(parents=True)
    (tmp_path / "runs" / "latest").symlink_to("old")
    rc, url = run(tmp_path, argv, run_id="new")
    err = capsys.readouterr().err
    assert rc == 2
    assert f"endpoint {url}: the candidate runs mamba radix cache strategy 'no_buffer'" in err
    assert "restart the server with --mamba-radix-cache-strategy extra_buffer" in err
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["latest", "old"]
    assert (tmp_path / "runs" / "latest").readlink().name == "old"
    assert run(tmp_path, argv, "--dry-run")[0] == 2  # the plan refuses it too


def test_incremental_streaming_is_reported(tmp_path, capsys):
    """(d) incremental_streaming_output: the probe records it and the plan shows it."""
    payload = server_infos.write(tmp_path / "inc.json", server_infos.current(INTERVAL, BLOCK, incremental=True))
    argv = candidate_args(INTERVAL, "--info-paths", "/server_info", "--server-info-json", payload)
    rc, _ = run(tmp_path, argv, "--dry-run")
    out = capsys.readouterr().out
    assert rc == 0 and f"reports: backend sglang, streaming incremental, block size {BLOCK}" in out

    async def go(url):
        async with aiohttp.ClientSession() as http:
            return await make_backend("sglang").probe(http, url, "candidate")

    with servers(argv) as (url,):
        info = asyncio.run(go(url))
    assert info["incremental_streaming_output"] is True and info["specgate_probe"]["streaming"] == "incremental"


def test_openai_only_server_gets_a_hint(tmp_path, capsys):
    rc, url = run(tmp_path, candidate_args(INTERVAL, "--info-paths", "", "--v1-models"))
    err = capsys.readouterr().err
    assert rc == 2 and not (tmp_path / "runs").exists()
    assert (f"endpoint {url}: neither /server_info nor /get_server_info exists (GET /server_info: HTTP 404, "
            "GET /get_server_info: HTTP 404); GET /v1/models answers, so this is an OpenAI-compatible server "
            "(vLLM?): run with --backend openai") in err


def test_unreachable_endpoint_writes_nothing(tmp_path, capsys):
    workload = write_workload(tmp_path / "w.jsonl", make_sessions(1))
    with servers(reference_args()) as (r,):
        rc = main(["--suite", str(workload), "--endpoint", "http://127.0.0.1:9", "--reference-endpoint", r,
                   "--runs-dir", str(tmp_path / "runs"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "endpoint http://127.0.0.1:9: /server_info is not reachable" in err
    assert "is the server running?" in err and not (tmp_path / "runs").exists()
