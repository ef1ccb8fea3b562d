"""The gate end to end on a real third-party engine: vLLM's CPU build under Ray, tiny models built here.

Runs when `.venv-vllm` exists (`make vllm`); CI builds it first and sets
SPECGATE_REQUIRE_VLLM=1, so there a missing vLLM fails this test instead of skipping it.
The models are built, not downloaded (`python -m harness.models build --arch llama|mamba2`).

* Llama: the first frozen sessions at concurrency 1 and 4, with n-gram speculation and prefix
  caching on the candidate and a calibration baseline: PASS. Llama in fp32 matches transformers
  to ~1e-5 in log-prob (shared/reference/vllm-cpu.md), so the candidate's first turns must equal
  transformers' own greedy continuation of the same ids (`hf_build.py continue`): an oracle
  independent of vLLM.
* Mamba2: n-gram speculation without a prefix cache changes tokens on the CPU build (each request
  flips at its first verify step, at margins no measured numerics close): FAIL, every request hard,
  the diagnosis naming speculation, though the pool restored nothing and no control shares its path.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from protocol.hf_tokenizer import load_tokenizer
from records.jsonl import load_run
from workloads import load_suite
from workloads.schema import dumps_jsonl

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
pytestmark = pytest.mark.slow
SPEC = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}'


@pytest.fixture(scope="module")
def vllm_python():
    if not VLLM_PYTHON.exists():
        if os.environ.get("SPECGATE_REQUIRE_VLLM") == "1":
            pytest.fail(f"SPECGATE_REQUIRE_VLLM=1 but {VLLM_PYTHON} is missing: `make vllm` failed or was not run")
        pytest.skip("no .venv-vllm (run `make vllm` to build vLLM's CPU build; CI does)")
    return str(VLLM_PYTHON)


def _transformers_continuations(vllm_python: str, model: Path, sessions, tmp_path: Path) -> dict:
    prompts = [{"input_ids": list(s.turns[0].input_ids), "n": s.turns[0].max_new_tokens} for s in sessions]
    (tmp_path / "prompts.json").write_text(json.dumps(prompts))
    proc = subprocess.run([vllm_python, str(ROOT / "harness" / "models" / "hf_build.py"), "continue", str(model),
                           str(tmp_path / "prompts.json")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {tuple(c["input_ids"]): c for c in json.loads(proc.stdout.strip().splitlines()[-1])}


def _build(vllm_python: str, model: Path, arch: str) -> None:
    build = subprocess.run([sys.executable, "-m", "harness.models", "build", str(model), "--arch", arch,
                            "--vllm-python", vllm_python], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]


def test_vllm_llama_with_ngram_speculation_and_prefix_caching_passes(vllm_python, tmp_path):
    model = tmp_path / "llama"
    _build(vllm_python, model, "llama")
    card = json.loads((model / "specgate_model.json").read_text())
    assert card["vllm_args"] == ["--dtype", "float32"] and card["architectures"] == ["LlamaForCausalLM"]
    frozen = load_suite("frozen", tokenizer=load_tokenizer(str(model)))[:6]  # the model's own tokens
    suite = tmp_path / "suite.jsonl"
    suite.write_text(dumps_jsonl(frozen))
    cmd = [sys.executable, "-m", "harness.run", "--engine", "vllm", "--model", str(model), "--vllm-python",
           vllm_python, "--candidate-args", f"--enable-prefix-caching --speculative-config '{SPEC}'",
           "--calibrate", "--suite", str(suite), "--concurrency", "1,4", "--runs-dir", str(tmp_path / "runs"),
           "--run-id", "ci", "--no-progress", "--startup-timeout", "900"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1700)
    print(proc.stdout[-4000:], proc.stderr[-4000:])
    assert proc.returncode == 0
    run_dir = tmp_path / "runs" / "ci"
    config = json.loads((run_dir / "config.json").read_text())
    engine = config["pools"]["vllm"]["engine"]
    assert engine["speculative"] and engine["radix_cache"] and engine["block_size"] == 5
    assert engine["interval"] == int(config["pools"]["vllm"]["server_info"]["mamba_track_interval"]) > 0
    assert config["calibration"]["requests"] == 2 * 6 * 2  # the baseline answered every request
    records = load_run(run_dir).candidates
    assert len(records) == 2 * 2 * 6 * 2  # vllm + baseline pools, 2 sweep points, 6 two-turn sessions
    assert all(r["error"] is None for r in records)
    refs = _transformers_continuations(vllm_python, model, frozen, tmp_path)
    first = [r for r in records if r["turn"] == 0]
    assert len(first) == 2 * 2 * 6
    for r in first:  # vLLM with speculation and prefix caching emits transformers' own greedy tokens,
        hf = refs[tuple(r["input_ids"])]  # up to a near-tie (top-1/top-2 gap < 1e-3 nats, 100x the fp32 noise)
        assert len(r["output_ids"]) == len(hf["output_ids"])
        pairs = zip(r["output_ids"], hf["output_ids"], strict=True)
        same = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
        assert same is None or hf["margins"][same] < 1e-3, (r["key"], same, hf["margins"][same])
    counters = json.loads((run_dir / "server_counters.json").read_text())
    delta = next(iter(counters["vllm"].values()))["delta"]
    assert delta["vllm:spec_decode_num_accepted_tokens_total"] > 0 and delta["vllm:prefix_cache_hits_total"] > 0
    assert "accept rate" in proc.stdout and "calibration: clean baseline" in proc.stdout
    # no restore-window probe over the OpenAI protocol (vLLM would serve it uncached), and the report says so
    assert all("window_start" not in r for r in records)
    assert ("judged on their outputs alone: the OpenAI protocol cannot score a prompt without changing what the "
            "server caches") in (run_dir / "summary.md").read_text()


def test_vllm_mamba2_ngram_speculation_that_changes_tokens_fails(vllm_python, tmp_path):
    """Speculation alone (`--no-enable-prefix-caching`): the pool restores nothing and only the baseline calibrates
    it, so no control shares its path; its flips are still no numerics (the baseline drifts by ~0, the prefill's
    token agrees), so the gate FAILs with every request hard and names speculation."""
    model = tmp_path / "mamba2"
    _build(vllm_python, model, "mamba2")
    frozen = load_suite("frozen", tokenizer=load_tokenizer(str(model)))[:4]
    suite = tmp_path / "suite.jsonl"
    suite.write_text(dumps_jsonl(frozen))
    cmd = [sys.executable, "-m", "harness.run", "--engine", "vllm", "--model", str(model), "--vllm-python",
           vllm_python, "--candidate-args", f"--no-enable-prefix-caching --speculative-config '{SPEC}'",
           "--suite", str(suite), "--concurrency", "4", "--runs-dir", str(tmp_path / "runs"), "--run-id", "ci",
           "--no-progress", "--startup-timeout", "900"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1700)
    print(proc.stdout[-4000:], proc.stderr[-4000:])
    assert proc.returncode == 1
    run_dir = tmp_path / "runs" / "ci"
    config = json.loads((run_dir / "config.json").read_text())
    engine = config["pools"]["vllm"]["engine"]
    assert engine["speculative"] and not engine["radix_cache"]
    assert config["calibration"]["per_pool"]["vllm"]["controls"] == ["baseline"]  # no control shares its path
    requests = pd.read_csv(run_dir / "requests.csv")
    gated = requests[requests["pool"] == "vllm"]
    assert len(gated) == 4 * 2 and (gated["class"] == "hard").all() and not gated["restored"].any()
    summary = (run_dir / "summary.md").read_text()
    assert f"FAIL: {len(gated)} hard mismatches" in proc.stdout
    assert "that no measured numerics explain" in summary and "path numerics (not judged)" not in summary
    assert ("**Diagnosis:** The evidence points at speculative verify / accept: every flagged request ran with "
            "speculation and no prefix cache") in summary
