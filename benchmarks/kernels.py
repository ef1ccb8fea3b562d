"""Benchmark: each Triton kernel against its torch reference at serving shapes, on CUDA.

    python benchmarks/kernels.py [--batches 1 4 16 64] [--blocks 8 16] [--quick]

Times are the median of `triton.testing.do_bench` (L2 flushed between runs). GB/s is
the kernel's compulsory traffic (inputs read once, outputs and states written once)
over its time, and "%copy" compares it to the device's copy bandwidth measured with a
1 GiB clone. Shapes: the engine's "small" preset and a Qwen3-Next-like one (32 heads
of 128 x 128). Without a CUDA device it says so and exits 0.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine.kernels as kernels  # noqa: E402
from engine.kernels import conv_triton, gdn_triton  # noqa: E402
from engine.kernels.state_scatter_naive import state_scatter_naive  # noqa: E402
from engine.kernels.state_scatter_triton import state_scatter_triton  # noqa: E402
from engine.model.config import preset  # noqa: E402

Timer = Callable[[Callable[[], object]], float]  # fn -> milliseconds


@dataclass(frozen=True)
class LinearShape:
    """The linear-attention dimensions one benchmark row uses."""

    name: str
    heads: int  # value heads (q/k heads equal: the kernel contract's layout)
    head_k_dim: int
    head_v_dim: int
    conv_dim: int
    conv_kernel: int
    gdn_layers: int


def serving_shapes() -> list[LinearShape]:
    """The engine's small preset and a Qwen3-Next-like shape."""
    cfg = preset("small")
    return [
        LinearShape("small", cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim,
                    cfg.conv_dim, cfg.linear_conv_kernel_dim, len(cfg.linear_layers)),
        LinearShape("qwen3-next", 32, 128, 128, 2 * 32 * 128 + 32 * 128, 4, 36),
    ]


@dataclass(frozen=True)
class Row:
    kernel: str
    shape: str
    mode: str
    batch: int
    block: int
    triton_ms: float
    torch_ms: float
    bytes_moved: int

    @property
    def gbps(self) -> float:
        return self.bytes_moved / (self.triton_ms * 1e-3) / 1e9


def _gdn_case(s: LinearShape, B: int, T: int, verify: bool, device: str, timer: Timer) -> Row:
    act = torch.bfloat16
    H, Dk, Dv = s.heads, s.head_k_dim, s.head_v_dim
    q = F.normalize(torch.randn(B, T, H, Dk, device=device), dim=-1).to(act)
    k = F.normalize(torch.randn(B, T, H, Dk, device=device), dim=-1).to(act)
    v = torch.randn(B, T, H, Dv, device=device, dtype=act)
    g = (-F.softplus(torch.randn(B, T, H, device=device)) * 0.5).to(act)
    beta = torch.sigmoid(torch.randn(B, T, H, device=device)).to(act)
    pool = torch.randn(2 * B + 1, H, Dk, Dv, device=device) * 0.1  # [N, H, Dk, Dv] fp32
    slots = torch.randperm(2 * B + 1, device=device)[:B]
    inter = torch.empty(B, T, H, Dk, Dv, device=device) if verify else None

    def run_triton():
        return gdn_triton.fused_recurrent_gdn(q, k, v, g, beta, pool, slots, Dk**-0.5, inter)

    def run_torch():
        return _forced_reference(kernels.gdn_pool_forward, q, k, v, g, beta, pool, slots, Dk**-0.5, inter)

    states = B * H * Dk * Dv * 4
    moved = (q.numel() + k.numel() + v.numel() * 2 + g.numel() + beta.numel()) * 2 + states
    moved += T * states if verify else states
    return _row("gdn", s, "verify" if verify else "decode", B, T, run_triton, run_torch, moved, timer)


def _conv_case(s: LinearShape, B: int, T: int, verify: bool, device: str, timer: Timer) -> Row:
    C, K = s.conv_dim, s.conv_kernel
    x = torch.randn(B, T, C, device=device, dtype=torch.bfloat16)
    weight = torch.randn(C, K, device=device, dtype=torch.bfloat16)
    pool = torch.randn(2 * B + 1, C, K - 1, device=device)  # [N, C, K-1]
    slots = torch.randperm(2 * B + 1, device=device)[:B]
    inter = torch.empty(B, T, C, K - 1, device=device) if verify else None

    def run_triton():
        return conv_triton.causal_conv1d_pool(x, pool, slots, weight, inter)

    def run_torch():
        return _forced_reference(kernels.conv_pool_forward, x, pool, slots, weight, inter)

    windows = B * C * (K - 1) * 4
    moved = 2 * x.numel() * 2 + weight.numel() * 2 + windows + (T * windows if verify else windows)
    return _row("conv", s, "verify" if verify else "decode", B, T, run_triton, run_torch, moved, timer)


def _scatter_case(s: LinearShape, B: int, T: int, device: str, timer: Timer) -> Row | None:
    L, H, Dk, Dv, C, KW = s.gdn_layers, s.heads, s.head_k_dim, s.head_v_dim, s.conv_dim, s.conv_kernel - 1
    entry = (H * Dk * Dv + C * KW) * 4
    need = L * (B * T + 3 * B + 1) * entry
    if device == "cuda" and need > 0.6 * torch.cuda.mem_get_info()[0]:
        return None
    N = 3 * B + 1
    rec_pool = torch.zeros(L, N, H, Dk, Dv, device=device)
    conv_pool = torch.zeros(L, N, C, KW, device=device)
    rec_inter = torch.randn(L, B, T, H, Dk, Dv, device=device)
    conv_inter = torch.randn(L, B, T, C, KW, device=device)
    slots = torch.randperm(N, device=device)
    working, track_slots = slots[:B], slots[B : 2 * B]
    commit_steps = torch.randint(0, T, (B,), device=device)
    # about one request in eight crosses a track boundary in a verify step
    track_steps = torch.where(torch.arange(B, device=device) % 8 == 0, commit_steps, -1)

    args = (rec_pool, conv_pool, rec_inter, conv_inter, working, commit_steps, track_slots, track_steps)
    copies = B + int((track_steps >= 0).sum())
    return _row("scatter", s, f"L={L}", B, T, lambda: state_scatter_triton(*args),
                lambda: state_scatter_naive(*args), 2 * L * copies * entry, timer)


def _forced_reference(op, *args):
    """The op as the dispatch runs it on CPU: its torch reference (also what force_torch_kernels picks)."""
    kernels.set_force_torch(True)
    try:
        return op(*args)
    finally:
        kernels.set_force_torch(False)


def _row(kernel: str, s: LinearShape, mode: str, B: int, T: int, run_triton, run_torch, moved: int,
         timer: Timer) -> Row:
    return Row(kernel, s.name, mode, B, T, timer(run_triton), timer(run_torch), moved)


def measure(shapes: list[LinearShape], batches: list[int], blocks: list[int], device: str,
            timer: Timer) -> list[Row]:
    """Every kernel at every shape: GDN and conv in decode (T=1) and verify (each block), then the scatter."""
    rows: list[Row] = []
    for s in shapes:
        for B in batches:
            for case in (_gdn_case, _conv_case):
                rows.append(case(s, B, 1, False, device, timer))
                rows.extend(case(s, B, T, True, device, timer) for T in blocks)
            rows.extend(r for T in blocks if (r := _scatter_case(s, B, T, device, timer)) is not None)
    return rows


def format_table(rows: list[Row], copy_gbps: float) -> str:
    head = (f"{'kernel':<8} {'shape':<11} {'mode':<7} {'B':>3} {'T':>3} {'triton us':>10} {'torch us':>10} "
            f"{'speedup':>8} {'GB/s':>8} {'%copy':>6}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.kernel:<8} {r.shape:<11} {r.mode:<7} {r.batch:>3} {r.block:>3} {r.triton_ms * 1e3:>10.1f} "
            f"{r.torch_ms * 1e3:>10.1f} {r.torch_ms / r.triton_ms:>7.1f}x {r.gbps:>8.1f} "
            f"{100 * r.gbps / copy_gbps:>5.0f}%"
        )
    return "\n".join(lines)


def copy_bandwidth(device: str, timer: Timer, nbytes: int = 1 << 30) -> float:
    """GB/s of a big clone (read + write), the ceiling a memory-bound kernel can approach."""
    x = torch.empty(nbytes // 4, device=device)
    return 2 * nbytes / (timer(lambda: x.clone()) * 1e-3) / 1e9


def cpu_timer(fn) -> float:
    """Median wall time of a few runs in ms (for smoke runs without CUDA)."""
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--blocks", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--quick", action="store_true", help="batches 1 and 64, block 8")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to benchmark")
        return 0
    import triton.testing

    def timer(fn) -> float:
        return triton.testing.do_bench(fn, return_mode="median")

    batches, blocks = ([1, 64], [8]) if args.quick else (args.batches, args.blocks)
    torch.manual_seed(0)
    copy_gbps = copy_bandwidth("cuda", timer)
    print(f"device: {torch.cuda.get_device_name()}  copy bandwidth: {copy_gbps:.0f} GB/s")
    print("activations bf16, states fp32; us = median of triton.testing.do_bench")
    print(format_table(measure(serving_shapes(), batches, blocks, "cuda", timer), copy_gbps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
