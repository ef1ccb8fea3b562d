"""benchmarks/gpu_check.py, the prepared GPU check: its arguments, and its CPU path (the same three steps at tiny
sizes: kernels interpreted, the gate runs as --dry-run) run end to end, so the script works when a GPU comes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_check  # noqa: E402


def test_arguments_and_the_gate_runs_it_would_make():
    args = gpu_check.parse_args(["--skip-gates", "--json", "f.json"])
    assert (args.device, args.skip_gates, args.json) == ("cuda", True, "f.json")
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--device", "rocm"])
    runs = {name: (extra, expected) for name, extra, expected in gpu_check.GATES}
    assert runs["fp32 clean"] == ((), "PASS") and runs["bf16 stale-seq-lens"] == (
        ("--dtype", "bfloat16", "--inject-fault", "stale-seq-lens"), "FAIL")
    assert " ".join(gpu_check.GATE_ARGS).startswith("--intervals 128 --concurrency 4")


@pytest.mark.slow
def test_the_cpu_path_runs_every_step(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the script sets it for --device cpu
    out = tmp_path / "figures.json"
    proc = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--device", "cpu", "--json", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["device"].startswith("device: cpu (a check of the script; no GPU figure)")
    kernels = {(r["dtype"], r["tensor"]): r["max_abs_diff"] for r in figures["kernels"]}
    assert len(kernels) == 28 and max(v for (d, _), v in kernels.items() if d == "float32") < 1e-5
    assert all(v == 0 for (_, name), v in kernels.items() if "windows" in name)  # conv windows are copies
    assert [(r["speculative_algorithm"], r["concurrency"]) for r in figures["throughput"]] == [
        ("NONE", 1), ("DFLASH", 1), ("NONE", 16), ("DFLASH", 16)]
    assert all(r["decode_tokens_per_s"] > 0 for r in figures["throughput"])
    assert [(r["run"], r["exit"]) for r in figures["gates"]] == [(name, 0) for name, *_ in gpu_check.GATES]
    assert all(r["verdict"].startswith("placement:") and "--device cpu" in r["verdict"] for r in figures["gates"])
