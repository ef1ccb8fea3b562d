"""The causal depthwise conv of the Gated DeltaNet, the readable references.

The conv window of a sequence holds its last K-1 raw inputs [C, K-1]; each new
token's output is SiLU of the dot product of [window | x_t] with the weights.
"""

from __future__ import annotations

import torch


def causal_conv1d(
    x: torch.Tensor,  # [B, T, C]
    conv_state: torch.Tensor,  # [B, C, K-1] the previous K-1 inputs
    weight: torch.Tensor,  # [C, K] depthwise
) -> tuple[torch.Tensor, torch.Tensor]:
    """SiLU(depthwise causal conv) over x continuing from conv_state; returns (y, new_state)."""
    if not x.shape[1]:
        return causal_conv1d_verify(x, conv_state, weight)[0], conv_state.clone()
    y, xx = _conv(x, conv_state, weight)
    T, kw = x.shape[1], conv_state.shape[-1]
    return y.transpose(1, 2), xx[:, :, T : T + kw].contiguous()  # the last window: the final K-1 inputs


def _conv(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(SiLU(conv) [B, C, T] in x's dtype, the inputs [window | x] [B, C, K-1+T] in x's dtype).

    The products, their sum and the SiLU are fp32 and rounded once to x's dtype, as the CUDA
    causal-conv kernels (and conv_triton) compute them; in fp32 these are the plain fp32 ops.
    """
    K = weight.shape[1]
    xx = torch.cat([conv_state.to(x.dtype), x.transpose(1, 2)], dim=2)  # [B, C, K-1+T]: raw inputs
    frames = xx.unfold(2, K, 1)  # [B, C, T, K]
    y = torch.nn.functional.silu((frames.float() * weight.float()[None, :, None, :]).sum(-1))
    return y.to(x.dtype), xx


def causal_conv1d_verify(
    x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Like causal_conv1d, but returns the window after every step [B, T, C, K-1]; input untouched."""
    K = weight.shape[1]
    T = x.shape[1]
    y, xx = _conv(x, conv_state, weight)  # [B, C, T]
    windows = xx.unfold(2, K - 1, 1)[:, :, 1 : T + 1]  # [B, C, T, K-1]
    return y.transpose(1, 2), windows.permute(0, 2, 1, 3).contiguous()


def conv_window_at(x: torch.Tensor, conv_state: torch.Tensor, tokens: int) -> torch.Tensor:
    """The window after the first `tokens` of x [B, T, C] continuing from conv_state [B, C, K-1].

    It is the K-1 raw inputs before position `tokens` of [conv_state | x]: what a checkpoint at
    that position must hold (SGLang's `_init_track_conv_indices` gathers the same columns).
    """
    kw = conv_state.shape[-1]
    xx = torch.cat([conv_state.to(x.dtype), x.transpose(1, 2)], dim=2)  # [B, C, K-1+T]
    return xx[:, :, tokens : tokens + kw].contiguous()
