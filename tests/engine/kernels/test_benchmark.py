"""The kernel benchmark: its plumbing on CPU (tiny shapes, interpreted kernels), and the real run on CUDA."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import kernels as bench

REPO = Path(__file__).resolve().parents[3]
TINY = bench.LinearShape("tiny", heads=2, head_k_dim=4, head_v_dim=4, conv_dim=6, conv_kernel=4, gdn_layers=2)


def parse_table(text: str) -> tuple[list[tuple], list[tuple[float, ...]]]:
    """(kernel, shape, mode, B, T) of every row of a format_table table, and its (triton us, torch us, speedup,
    GB/s, %copy) figures (as printed: tiny interpreted shapes round some of them to 0)."""
    lines = text.splitlines()
    assert lines[0].split() == ["kernel", "shape", "mode", "B", "T", "triton", "us", "torch", "us", "speedup",
                                "GB/s", "%copy"] and set(lines[1]) == {"-"}, text
    keys, figures = [], []
    for line in lines[2:]:
        kernel, shape, mode, b, t, triton_us, torch_us, speedup, gbps, pct = line.split()
        assert speedup.endswith("x") and pct.endswith("%"), line
        keys.append((kernel, shape, mode, int(b), int(t)))
        figures.append((float(triton_us), float(torch_us), float(speedup[:-1]), float(gbps), float(pct[:-1])))
    return keys, figures


def expected_rows(shapes, batches, blocks) -> list[tuple]:
    """What `measure` covers: GDN and conv in decode and each verify block, then the scatter, per shape and batch."""
    out = []
    for s in shapes:
        for b in batches:
            for kernel in ("gdn", "conv"):
                out += [(kernel, s.name, "decode", b, 1)] + [(kernel, s.name, "verify", b, t) for t in blocks]
            out += [("scatter", s.name, f"L={s.gdn_layers}", b, t) for t in blocks]
    return out


def test_benchmark_rows_cover_every_kernel_and_mode():
    rows = bench.measure([TINY], batches=[2], blocks=[3], device="cpu", timer=bench.cpu_timer)
    assert [(r.kernel, r.shape, r.mode, r.batch, r.block) for r in rows] == expected_rows([TINY], [2], [3]) == [
        ("gdn", "tiny", "decode", 2, 1), ("gdn", "tiny", "verify", 2, 3), ("conv", "tiny", "decode", 2, 1),
        ("conv", "tiny", "verify", 2, 3), ("scatter", "tiny", "L=2", 2, 3),
    ]
    assert all(r.triton_ms > 0 and r.torch_ms > 0 and r.bytes_moved > 0 for r in rows)
    keys, figures = parse_table(bench.format_table(rows, copy_gbps=1.0))
    assert keys == expected_rows([TINY], [2], [3])
    assert [f[:2] for f in figures] == [(round(r.triton_ms * 1e3, 1), round(r.torch_ms * 1e3, 1)) for r in rows]


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only: checks what the benchmark says without a CUDA "
                    "device; test_benchmark_runs_on_cuda covers a machine that has one")
def test_benchmark_without_cuda_says_so_and_exits_zero(capsys):
    assert bench.main([]) == 0
    assert capsys.readouterr().out.strip() == "no CUDA device: nothing to benchmark"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: the benchmark's real path "
                    "(compiled Triton kernels timed with do_bench)")
def test_benchmark_runs_on_cuda(tmp_path):
    """The script as documented, kernels compiled (not interpreted): a device line and a row for every kernel."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # conftest.py set it for this process
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    proc = subprocess.run([sys.executable, "benchmarks/kernels.py", "--batches", "1", "--blocks", "8"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout.splitlines()
    assert out[0].startswith("device: ") and float(out[0].split("copy bandwidth: ")[1].split()[0]) > 0, out[0]
    assert out[1].startswith("activations bf16"), out[1]
    keys, figures = parse_table("\n".join(out[2:]))
    assert keys == expected_rows(bench.serving_shapes(), [1], [8])  # the scatter at Qwen3-Next shape needs ~1 GB
    assert all(triton > 0 and torch_us > 0 and speedup > 0 and gbps > 0 for triton, torch_us, speedup, gbps, _ in
               figures), out
