"""Building blocks: linear (bf16 as on a GPU), RMSNorm, gated RMSNorm, RoPE, tensor-parallel linears, SwiGLU MLP."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from engine.tp.group import SINGLE, TPContext


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear; bf16 on a CPU is computed as a GPU computes it: fp32 products and sums of the bf16 values,
    rounded once to bf16.

    That is the math of torch's own CPU bf16 GEMM too (fp32 accumulation), which on CPUs without
    bf16 instructions runs 2-4x slower than the fp32 GEMM used here; only the order of the fp32
    sums differs. fp32 (and CUDA) inputs take the plain F.linear.
    """
    if x.dtype == torch.bfloat16 and weight.dtype == torch.bfloat16 and x.device.type == "cpu":
        return F.linear(x.float(), weight.float(), None if bias is None else bias.float()).to(torch.bfloat16)
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """nn.Linear (same parameters and names) through `linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


class GatedRMSNorm(nn.Module):
    """norm(o) * silu(z) per head, as in Qwen3-Next's GDN output."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        of = o.float()
        of = of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()
        return (of * F.silu(z.float())).to(o.dtype)


class ColumnParallelLinear(nn.Module):
    """y = x W^T with W's output features split across ranks (no communication).

    `splits` lists the logical output blocks (e.g. q, k, v) so each rank takes its
    slice of every block from a full checkpoint.
    """

    def __init__(self, in_features: int, splits: list[int], tp: TPContext = SINGLE, bias: bool = False):
        super().__init__()
        self.tp = tp
        self.full_splits = list(splits)
        self.local_splits = [tp.shard(s, "output block") for s in splits]
        self.weight = nn.Parameter(torch.empty(sum(self.local_splits), in_features))
        self.bias = nn.Parameter(torch.zeros(sum(self.local_splits))) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)

    def shard_full(self, name: str, full: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a full [sum(splits), ...] tensor."""
        parts, off = [], 0
        for n, loc in zip(self.full_splits, self.local_splits, strict=True):
            parts.append(full[off + self.tp.rank * loc : off + (self.tp.rank + 1) * loc])
            off += n
        return torch.cat(parts, 0)


class RowParallelLinear(nn.Module):
    """y = all_reduce(x_local W_local^T): input features split across ranks."""

    def __init__(self, in_features: int, out_features: int, tp: TPContext = SINGLE):
        super().__init__()
        self.tp = tp
        self.in_local = tp.shard(in_features, "input features")
        self.weight = nn.Parameter(torch.empty(out_features, self.in_local))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(linear(x, self.weight))

    def shard_full(self, name: str, full: torch.Tensor) -> torch.Tensor:
        r = self.tp.rank
        return full[:, r * self.in_local : (r + 1) * self.in_local]


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden: int, intermediate: int, tp: TPContext = SINGLE):
        super().__init__()
        self.gate_up = ColumnParallelLinear(hidden, [intermediate, intermediate], tp)
        self.down = RowParallelLinear(intermediate, hidden, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


_INV_FREQ: dict[tuple[int, float, torch.device], torch.Tensor] = {}


def _inv_freq(D: int, theta: float, device: torch.device) -> torch.Tensor:
    """RoPE's frequencies, computed once per (head dim, theta, device): the same values every call."""
    key = (D, theta, device)
    if key not in _INV_FREQ:
        with torch.inference_mode(False), torch.no_grad():  # a plain tensor, usable by training too
            _INV_FREQ[key] = 1.0 / (theta ** (torch.arange(0, D, 2, device=device, dtype=torch.float32) / D))
    return _INV_FREQ[key]


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding (rotate-half form). x [B, T, H, D], positions [B, T]."""
    D = x.shape[-1]
    ang = positions.float()[..., None] * _inv_freq(D, theta, x.device)  # [B, T, D/2]
    cos, sin = ang.cos()[:, :, None, :], ang.sin()[:, :, None, :]
    xf = x.float()
    x1, x2 = xf[..., : D // 2], xf[..., D // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
