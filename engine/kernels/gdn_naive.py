"""Gated DeltaNet, the readable references: one token at a time.

State layout (shared by every form): recurrent state S per head is
[head_k_dim, head_v_dim], fp32. Per token t, with q and k already
L2-normalised:

    S <- exp(g_t) * S
    u  = beta_t * (v_t - S^T k_t)
    S <- S + k_t u^T
    o_t = S^T (scale * q_t)
"""

from __future__ import annotations

import torch


def gdn_recurrent(
    q: torch.Tensor,  # [B, T, H, Dk]
    k: torch.Tensor,  # [B, T, H, Dk]
    v: torch.Tensor,  # [B, T, H, Dv]
    g: torch.Tensor,  # [B, T, H] log-decay (<= 0)
    beta: torch.Tensor,  # [B, T, H]
    state: torch.Tensor,  # [B, H, Dk, Dv]
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs [B, T, H, Dv] and the final state; the input state is not modified."""
    o, states = gdn_verify(q, k, v, g, beta, state, scale)
    final = states[:, -1] if states.shape[1] else state.clone()
    return o, final


def gdn_verify(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    state: torch.Tensor, scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs [B, T, H, Dv] and every intermediate state [B, T, H, Dk, Dv].

    Step i is the state after token i. The input state is left untouched, which
    is what speculative verification needs: the accepted step is chosen later.
    """
    out_dtype = v.dtype
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    S = state.float().clone()
    B, T, H, _ = q.shape
    outs, states = [], []
    for t in range(T):
        S = S * g[:, t].exp()[..., None, None]
        kt, vt = k[:, t], v[:, t]  # [B, H, Dk], [B, H, Dv]
        u = beta[:, t, :, None] * (vt - (kt[..., None, :] @ S)[..., 0, :])  # S^T k
        S = S + kt[..., :, None] * u[..., None, :]  # k u^T
        outs.append(((q[:, t] * scale)[..., None, :] @ S)[..., 0, :])  # S^T q
        states.append(S)
    if T == 0:
        return q.new_zeros(B, 0, H, v.shape[-1]).to(out_dtype), S.new_zeros(B, 0, *S.shape[1:])
    return torch.stack(outs, 1).to(out_dtype), torch.stack(states, 1)
