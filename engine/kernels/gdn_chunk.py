"""Gated DeltaNet in chunked (WY) form: prefill in serving, every forward in training.

Within a chunk of C tokens the delta rule's sequential updates are solved as
one triangular system, so the work is matrix products; the state is carried
from chunk to chunk. Same math and state layout as gdn_naive.gdn_recurrent.
It is written to be differentiated too (training uses it from a zero state):
each chunk's output is stacked rather than written into a preallocated tensor,
whose slice writes' backward would copy the whole output once per chunk.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gdn_chunk(
    q: torch.Tensor,  # [B, T, H, Dk]
    k: torch.Tensor,  # [B, T, H, Dk]
    v: torch.Tensor,  # [B, T, H, Dv]
    g: torch.Tensor,  # [B, T, H]
    beta: torch.Tensor,  # [B, T, H]
    state: torch.Tensor | None,  # [B, H, Dk, Dv]; None: the zero state
    scale: float,
    chunk_size: int = 64,
    return_chunk_states: bool = False,
):
    """Outputs [B, T, H, Dv] (in v's dtype) and the final state; the input state is not modified.

    With `return_chunk_states` also the state after every chunk [B, N, H, Dk, Dv], N = ceil(T / C):
    entry n covers min((n + 1) * C, T) tokens (the last one is the final state). They are the
    states the chunked form carries anyway (FLA's `h`), so a prefill can checkpoint any
    chunk-aligned position of its extend without a second pass: see `state_after`.
    """
    out_dtype = v.dtype
    B, T, H, Dk = q.shape
    Dv = v.shape[-1]
    C = chunk_size
    pad = (-T) % C
    # [B, H, T, D] fp32; zero-padded tail tokens (k = v = beta = g = 0) leave the state unchanged
    q, k, v = (F.pad(x.float().transpose(1, 2), (0, 0, 0, pad)) for x in (q, k, v))
    g, beta = (F.pad(x.float().transpose(1, 2), (0, pad)) for x in (g, beta))
    N = (T + pad) // C
    q, k, v = (x.reshape(B, H, N, C, -1) for x in (q * scale, k, v))
    g = g.reshape(B, H, N, C).cumsum(-1)  # cumulative log-decay inside each chunk
    beta = beta.reshape(B, H, N, C)

    lower = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    strict_lower = lower.clone().fill_diagonal_(False)
    # decay[i, j] = exp(g_i - g_j) for j <= i
    decay = (g[..., :, None] - g[..., None, :]).masked_fill(~lower, float("-inf")).exp()
    k_beta = k * beta[..., None]
    # (I + L) W = rhs with L = strict_lower(diag(beta) K K^T * decay): the WY system of the chunk
    A = torch.eye(C, device=q.device) + (k_beta @ k.transpose(-1, -2) * decay).masked_fill(~strict_lower, 0.0)
    u = torch.linalg.solve_triangular(A, v * beta[..., None], upper=False)  # [B, H, N, C, Dv]
    w = torch.linalg.solve_triangular(A, k_beta * g.exp()[..., None], upper=False)  # [B, H, N, C, Dk]
    attn = (q @ k.transpose(-1, -2) * decay).masked_fill(~lower, 0.0)  # [B, H, N, C, C]
    q_decayed = q * g.exp()[..., None]
    k_to_end = k * (g[..., -1:] - g).exp()[..., None]
    chunk_decay = g[..., -1:].exp()[..., None]  # [B, H, N, 1, 1]

    S = q.new_zeros(B, H, Dk, Dv) if state is None else state.float().clone()
    outs, states = [], []
    # unbind once: indexing chunk n inside the loop would make the backward copy whole tensors per chunk
    for u_n, w_n, qd_n, attn_n, kt_n, d_n in zip(*(x.unbind(2) for x in (u, w, q_decayed, attn, k_to_end,
                                                                          chunk_decay)), strict=True):
        v_new = u_n - w_n @ S  # corrected values [B, H, C, Dv]
        outs.append(qd_n @ S + attn_n @ v_new)
        S = S * d_n + kt_n.transpose(-1, -2) @ v_new
        if return_chunk_states:
            states.append(S)
    out = torch.stack(outs, 2).reshape(B, H, N * C, Dv)[:, :, :T].transpose(1, 2)
    if return_chunk_states:
        chunk_states = torch.stack(states, 1) if states else S.new_zeros(B, 0, H, Dk, Dv)
        return out.to(out_dtype).contiguous(), S, chunk_states
    return out.to(out_dtype).contiguous(), S


def state_after(chunk_states: torch.Tensor, tokens: int, total: int, chunk_size: int = 64) -> torch.Tensor:
    """From `gdn_chunk(..., return_chunk_states=True)` over `total` tokens: the state after `tokens`.

    `tokens` must be a multiple of the chunk size or the extend's end: those are the only
    positions whose state the chunked form materialises (SGLang reads `h` for the first kind and
    the final state for the second; reading the final state for the first is bug #33515's class).
    """
    if not (0 < tokens <= total and (tokens % chunk_size == 0 or tokens == total)):
        raise ValueError(f"no chunk state after {tokens} of {total} tokens (chunk size {chunk_size})")
    return chunk_states[:, -(-tokens // chunk_size) - 1]
