"""The gate end to end on a real SGLang: `--engine sglang` under Ray, SGLang 0.5.23's CPU path, a tiny Llama built here.

Runs when `.venv-sglang` exists (`make sglang`); CI builds it first and sets SPECGATE_REQUIRE_SGLANG=1, so there a
missing SGLang fails this test instead of skipping it (tests/sglang_setup/server.py). The model is built, not
downloaded (`python -m harness.models build --arch llama`, with SGLang's interpreter). The workload: the first
frozen sessions, built in the model's own tokens, at concurrency 4 (concurrency 1, and radix restores and restore
windows on the hybrid DFLASH + extra_buffer path, are tests/e2e/test_sglang_37818.py's). On CPU SGLang refuses
DFLASH and extra_buffer, so the candidate runs the radix cache without speculation: the run says so and the gate
judges what it has, the radix-cache path against the cold reference. Every candidate record carries SGLang's
`cached_tokens`, and the second turns hit the radix cache for real (> 0). Llama in fp32 on SGLang matches
transformers' own greedy continuation (`hf_build.py continue`), an oracle independent of SGLang.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from protocol.hf_tokenizer import load_tokenizer
from records.jsonl import load_run
from tests.sglang_setup.server import sglang_python, shared_llama
from workloads import load_suite
from workloads.schema import dumps_jsonl

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
SESSIONS = 6  # two-turn sessions: 12 requests per sweep point, on two servers that take minutes to start


def _transformers_continuations(python: str, model: Path, sessions, tmp_path: Path) -> dict:
    prompts = [{"input_ids": list(s.turns[0].input_ids), "n": s.turns[0].max_new_tokens} for s in sessions]
    (tmp_path / "prompts.json").write_text(json.dumps(prompts))
    proc = subprocess.run([python, str(ROOT / "harness" / "models" / "hf_build.py"), "continue", str(model),
                           str(tmp_path / "prompts.json")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {tuple(c["input_ids"]): c for c in json.loads(proc.stdout.strip().splitlines()[-1])}


def test_sglang_llama_with_the_radix_cache_passes_against_the_cold_reference(tmp_path, tmp_path_factory):
    python = sglang_python()
    model = shared_llama(python, tmp_path_factory)  # built once per session, shared with the contract test
    frozen = load_suite("frozen", tokenizer=load_tokenizer(str(model)))[:SESSIONS]  # the model's own tokens
    suite = tmp_path / "suite.jsonl"
    suite.write_text(dumps_jsonl(frozen))
    cmd = [sys.executable, "-m", "harness.run", "--engine", "sglang", "--model", str(model), "--sglang-python",
           python, "--suite", str(suite), "--concurrency", "4", "--runs-dir", str(tmp_path / "runs"),
           "--run-id", "ci", "--no-progress", "--startup-timeout", "900"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1700)
    print(proc.stdout[-4000:], proc.stderr[-4000:])
    assert proc.returncode == 0
    assert "PASS" in proc.stdout
    assert "pool sglang: no speculation (SGLang's CPU platform refuses --speculative-algorithm DFLASH" in proc.stdout
    run_dir = tmp_path / "runs" / "ci"
    config = json.loads((run_dir / "config.json").read_text())
    cand, ref = config["pools"]["sglang"], config["pools"]["reference"]
    assert {k: cand["engine"][k] for k in ("interval", "block_size", "strategy", "speculative", "radix_cache")} == {
        "interval": None, "block_size": None, "strategy": "radix", "speculative": False, "radix_cache": True}
    assert (ref["engine"]["radix_cache"], ref["server_info"]["disable_radix_cache"]) == (False, True)
    info = cand["server_info"]
    assert (info["version"], info["device"], info["dtype"], info["uses_mamba_radix_cache"]) == (
        "0.5.23", "cpu", "float32", False)
    assert info["api_key"] == "<redacted>" and "--api-key <redacted>" in info["launch_command"]
    assert "speculation" in config["narrowed"]["sglang"]
    logs = {p.name: p.read_text(errors="replace") for p in (run_dir / "logs").glob("*.log")}
    keys = {k for text in logs.values() for k in re.findall(r"'api_key': '([^']*)'", text)}
    assert len(logs) >= 2 and "server_args=" in "".join(logs.values()) and keys == {"<redacted>"}  # never the key
    records = load_run(run_dir).candidates
    assert len(records) == SESSIONS * 2  # one sweep point, two-turn sessions
    assert all(r["error"] is None for r in records)
    assert all(isinstance(r["cached_tokens"], int) for r in records)
    second = [r for r in records if r["turn"] == 1]
    assert all(r["cached_tokens"] > 0 for r in second)  # turn 1 extends turn 0: a real radix hit
    # the restore-window probe on a real SGLang: logprob_start_len at the checkpoint restores it again, and the
    # prompt past it scores as the reference's prefill does (fp32: to float rounding)
    for r in second:
        assert (r["window_start"], r["window_cached_tokens"]) == (r["cached_tokens"], r["cached_tokens"]), r["key"]
        assert len(r["window_logprobs"]) == len(r["window_ref_logprobs"]) == r["input_len"] - r["cached_tokens"] - 1
        assert max(abs(a - b) for a, b in zip(r["window_logprobs"], r["window_ref_logprobs"], strict=True)) < 1e-3
    refs = _transformers_continuations(python, model, frozen, tmp_path)
    for r in (r for r in records if r["turn"] == 0):  # SGLang's radix-cache path emits transformers' greedy tokens,
        hf = refs[tuple(r["input_ids"])]  # up to a near-tie (top-1/top-2 gap < 1e-3 nats, 100x the fp32 noise)
        pairs = zip(r["output_ids"], hf["output_ids"], strict=True)
        same = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
        assert same is None or hf["margins"][same] < 1e-3, (r["key"], same, hf["margins"][same])
