"""Gated DeltaNet in chunked (WY) form, for prefill.

Within a chunk of C tokens the delta rule's sequential updates are solved as
one triangular system, so the work is matrix products; the state is carried
from chunk to chunk. Same math and state layout as gdn_naive.gdn_recurrent.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gdn_chunked(
    q: torch.Tensor,  # [B, T, H, Dk]
    k: torch.Tensor,  # [B, T, H, Dk]
    v: torch.Tensor,  # [B, T, H, Dv]
    g: torch.Tensor,  # [B, T, H]
    beta: torch.Tensor,  # [B, T, H]
    state: torch.Tensor,  # [B, H, Dk, Dv]
    scale: float,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs [B, T, H, Dv] and the final state; the input state is not modified."""
    out_dtype = v.dtype
    B, T, H, Dk = q.shape
    Dv = v.shape[-1]
    C = chunk_size
    pad = (-T) % C
    # [B, H, T, D] fp32; zero-padded tail tokens (k = v = beta = g = 0) leave the state unchanged
    q, k, v = (F.pad(x.float().transpose(1, 2), (0, 0, 0, pad)) for x in (q, k, v))
    g, beta = (F.pad(x.float().transpose(1, 2), (0, pad)) for x in (g, beta))
    N = (T + pad) // C
    q = q * scale
    q, k, v = (x.reshape(B, H, N, C, -1) for x in (q, k, v))
    g = g.reshape(B, H, N, C).cumsum(-1)  # cumulative log-decay inside each chunk
    beta = beta.reshape(B, H, N, C)

    lower = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    strict_lower = lower.clone().fill_diagonal_(False)
    # decay[i, j] = exp(g_i - g_j) for j <= i
    decay = (g[..., :, None] - g[..., None, :]).masked_fill(~lower, float("-inf")).exp()
    k_beta = k * beta[..., None]
    # (I + L) W = rhs with L = strict_lower(diag(beta) K K^T * decay): the WY system of the chunk
    L = (k_beta @ k.transpose(-1, -2) * decay).masked_fill(~strict_lower, 0.0)
    eye = torch.eye(C, device=q.device)
    A = eye + L
    u = torch.linalg.solve_triangular(A, v * beta[..., None], upper=False)  # [B, H, N, C, Dv]
    w = torch.linalg.solve_triangular(A, k_beta * g.exp()[..., None], upper=False)  # [B, H, N, C, Dk]

    S = state.float().clone()
    out = torch.empty(B, H, N, C, Dv, device=q.device)
    for n in range(N):
        qn, kn, gn = q[:, :, n], k[:, :, n], g[:, :, n]
        v_new = u[:, :, n] - w[:, :, n] @ S  # corrected values [B, H, C, Dv]
        attn = (qn @ kn.transpose(-1, -2) * decay[:, :, n]).masked_fill(~lower, 0.0)
        out[:, :, n] = (qn * gn.exp()[..., None]) @ S + attn @ v_new
        g_last = gn[..., -1:]  # [B, H, 1]
        S = S * g_last.exp()[..., None] + (kn * (g_last - gn).exp()[..., None]).transpose(-1, -2) @ v_new
    out = out.reshape(B, H, N * C, Dv)[:, :, :T].transpose(1, 2)
    return out.to(out_dtype).contiguous(), S
