"""The kernel benchmark's plumbing on CPU: tiny shapes through the interpreted kernels, wall-clock timed."""

import torch

from benchmarks import kernels as bench


def test_benchmark_rows_cover_every_kernel_and_mode():
    tiny = bench.LinearShape("tiny", heads=2, head_k_dim=4, head_v_dim=4, conv_dim=6, conv_kernel=4,
                             gdn_layers=2)
    rows = bench.measure([tiny], batches=[2], blocks=[3], device="cpu", timer=bench.cpu_timer)
    assert [(r.kernel, r.mode, r.block) for r in rows] == [
        ("gdn", "decode", 1), ("gdn", "verify", 3), ("conv", "decode", 1), ("conv", "verify", 3),
        ("scatter", "L=2", 3),
    ]
    assert all(r.triton_ms > 0 and r.torch_ms > 0 and r.bytes_moved > 0 for r in rows)
    table = bench.format_table(rows, copy_gbps=1.0)
    assert len(table.splitlines()) == 2 + len(rows) and "%copy" in table


def test_benchmark_without_cuda_says_so_and_exits_zero(capsys):
    if torch.cuda.is_available():
        return
    assert bench.main([]) == 0
    assert capsys.readouterr().out.strip() == "no CUDA device: nothing to benchmark"
