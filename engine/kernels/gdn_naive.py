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
    own_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs [B, T, H, Dv] and the final state; the input state is not modified unless `own_state`
    (then it may be updated in place: see gdn_verify)."""
    if q.shape[1] == 0:
        return gdn_verify(q, k, v, g, beta, state, scale)[0], state.float().clone()
    final = []
    o, _ = gdn_verify(q, k, v, g, beta, state, scale, final=final, own_state=own_state)
    return o, final[0]


def gdn_verify(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    state: torch.Tensor, scale: float, states_out: torch.Tensor | None = None, final: list | None = None,
    own_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Outputs [B, T, H, Dv] and every intermediate state [B, T, H, Dk, Dv].

    Step i is the state after token i. The input state is left untouched, which
    is what speculative verification needs: the accepted step is chosen later.
    `states_out` (fp32 [B, T, H, Dk, Dv]) receives the states instead of a new tensor;
    with `final` (a list) only the last state is kept, appended to it, and None is returned
    for the states (plain decode). Per step the work is the module doc's four lines over
    (B*H) batched [Dk, Dv] matrices: a few large ops, not one per head, since the cost of a
    decode step on a CPU is the number of ops. `own_state`: the caller hands `state` over (a
    private copy), so the steps update it in place instead of allocating a new state per step.
    """
    out_dtype = v.dtype
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    B, T, H, Dk = q.shape
    Dv = v.shape[-1]
    BH = B * H
    keep = final is None
    steps = _step_views(states_out, BH) if keep else None  # write each step's state where it belongs
    S = state.float()
    if steps is None and not own_state and S.data_ptr() == state.data_ptr():
        S = S.clone()  # the input state stays untouched
    S = S.contiguous().reshape(BH, Dk, Dv)
    if keep and states_out is None:
        states_out = S.new_empty(B, T, H, Dk, Dv)
    outs = q.new_empty(B, T, H, Dv)
    qs = q * scale
    for t in range(T):
        # exp of this step's [B, H] slice only: the same elementwise kernel path as one step at a time
        decay = g[:, t].exp().reshape(BH, 1, 1)
        if steps is None:
            S.mul_(decay)
        else:  # the same product, written into step t's slot of states_out instead of over S
            S = torch.mul(S, decay, out=steps[t])
        kt = k[:, t].reshape(BH, 1, Dk)
        u = beta[:, t].reshape(BH, 1, 1) * (v[:, t].reshape(BH, 1, Dv) - torch.bmm(kt, S))  # beta (v - S^T k)
        S.add_(kt.transpose(1, 2) * u)  # k u^T
        outs[:, t] = torch.bmm(qs[:, t].reshape(BH, 1, Dk), S).reshape(B, H, Dv)  # S^T q
        if keep and steps is None:
            states_out[:, t] = S.reshape(B, H, Dk, Dv)
    if not keep:
        final.append(S.reshape(B, H, Dk, Dv))
    return outs.to(out_dtype), states_out


def _step_views(states_out: torch.Tensor | None, BH: int) -> list[torch.Tensor] | None:
    """Step t of states_out ([B, T, H, Dk, Dv], fp32) as a contiguous [B*H, Dk, Dv] view, for every t;
    None when there is no buffer or its steps are not contiguous (then states are copied in per step).
    The engine's verify buffers are stored step-major so that they are contiguous (ModelRunner._verify_buffers)."""
    if states_out is None or states_out.dtype != torch.float32:
        return None
    views = [states_out[:, t] for t in range(states_out.shape[1])]
    if not all(x.is_contiguous() for x in views):
        return None
    return [x.view(BH, *x.shape[2:]) for x in views]
