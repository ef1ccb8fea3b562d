"""Kernel dispatch: CUDA tensors use the Triton kernels, CPU tensors the torch references.

Every op lives in `<op>_naive.py` (the readable reference), optionally
`<op>_chunk.py` (a faster torch form) and `<op>_triton.py`; ops: `gdn` (the
delta rule), `conv` (the causal conv window), `state_scatter` (the post-verify
commit). Every op here works on the linear-state pool directly (per-sequence
slot indices), so the model never copies states around by hand. `force_torch`
(EngineConfig.force_torch_kernels) pins the references even on CUDA for A/B runs.
"""

from __future__ import annotations

import torch

from engine.kernels.conv_naive import causal_conv1d, causal_conv1d_verify, conv_window_at
from engine.kernels.gdn_chunk import gdn_chunk, state_after
from engine.kernels.gdn_naive import gdn_recurrent, gdn_verify

_FORCE_TORCH = False


def set_force_torch(flag: bool) -> None:
    """Use the torch references everywhere (EngineConfig.force_torch_kernels)."""
    global _FORCE_TORCH
    _FORCE_TORCH = bool(flag)


def use_triton(t: torch.Tensor) -> bool:
    """The dispatch decision: Triton for CUDA tensors unless forced to the references."""
    return t.is_cuda and not _FORCE_TORCH


def gdn_pool_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    state_pool: torch.Tensor,  # [N, H, Dk, Dv] one layer's recurrent states
    slots: torch.Tensor,  # [B] long
    scale: float,
    intermediate: torch.Tensor | None = None,  # [B, T, H, Dk, Dv]: verify mode
    track_slots: torch.Tensor | None = None,  # [B] long: extend checkpoint slot per sequence
    track_offsets: torch.Tensor | None = None,  # [B] long: tokens of this forward to checkpoint after, -1 none
) -> torch.Tensor:
    """Run the delta rule for B sequences whose states live in `state_pool[slots]`.

    Decode/extend mode (intermediate is None): the pool states advance in place, and where
    track_offsets[b] >= 0 the state after that many of this forward's tokens is also written to
    `state_pool[track_slots[b]]` (a prefill checkpoint: a multiple of the chunk size, or T).
    Verify mode: the pool is untouched and every step's state goes to `intermediate`.
    """
    if use_triton(q):
        from engine.kernels import gdn_triton

        if track_offsets is None:  # keeps the plain call (and its tests) unchanged
            return gdn_triton.fused_recurrent_gdn(q, k, v, g, beta, state_pool, slots, scale, intermediate)
        return gdn_triton.fused_recurrent_gdn(q, k, v, g, beta, state_pool, slots, scale, intermediate,
                                              track_slots=track_slots, track_steps=track_offsets - 1)
    # index_select/index_copy_: the same row copies as pool[slots] (= ...), with less per-op work
    state = state_pool.index_select(0, slots)
    if intermediate is not None:
        if intermediate.dtype == torch.float32:  # the states go straight into the verify buffer
            return gdn_verify(q, k, v, g, beta, state, scale, states_out=intermediate, own_state=True)[0]
        o, states = gdn_verify(q, k, v, g, beta, state, scale, own_state=True)
        intermediate.copy_(states)
        return o
    T = q.shape[1]
    if T > 1:
        o, final, chunk_states = gdn_chunk(q, k, v, g, beta, state, scale, return_chunk_states=True)
    else:
        o, final = gdn_recurrent(q, k, v, g, beta, state, scale, own_state=True)
        chunk_states = final[:, None]
    for b, off in _tracked_rows(track_offsets):
        snap = state_after(chunk_states, off, T) if T > 1 else chunk_states[:, 0]
        state_pool[track_slots[b]] = snap[b].to(state_pool.dtype)
    state_pool.index_copy_(0, slots, final.to(state_pool.dtype))
    return o


def _tracked_rows(track_offsets: torch.Tensor | None) -> list[tuple[int, int]]:
    """(row, offset) of every sequence that checkpoints in this extend."""
    if track_offsets is None:
        return []
    return [(b, off) for b, off in enumerate(track_offsets.tolist()) if off >= 0]


def conv_pool_forward(
    x: torch.Tensor,  # [B, T, C]
    conv_pool: torch.Tensor,  # [N, C, K-1]
    slots: torch.Tensor,  # [B]
    weight: torch.Tensor,  # [C, K]
    intermediate: torch.Tensor | None = None,  # [B, T, C, K-1]: verify mode
    track_slots: torch.Tensor | None = None,  # [B]: extend checkpoint slot per sequence
    track_offsets: torch.Tensor | None = None,  # [B]: tokens of this forward to checkpoint after, -1 none
) -> torch.Tensor:
    """SiLU(causal depthwise conv) continuing from the pooled windows; same modes as the GDN op.

    An extend checkpoint's window is gathered from the inputs before the kernel shifts the
    pooled window (it is raw inputs, on every device).
    """
    for b, off in _tracked_rows(track_offsets):
        window = conv_window_at(x[b : b + 1], conv_pool[slots[b : b + 1]], off)
        conv_pool[track_slots[b]] = window[0].to(conv_pool.dtype)
    if use_triton(x):
        from engine.kernels import conv_triton

        return conv_triton.causal_conv1d_pool(x, conv_pool, slots, weight, intermediate)
    window = conv_pool.index_select(0, slots)
    if intermediate is not None:
        y, windows = causal_conv1d_verify(x, window, weight)
        intermediate.copy_(windows)
        return y
    y, new_window = causal_conv1d(x, window, weight)
    conv_pool.index_copy_(0, slots, new_window.to(conv_pool.dtype))
    return y


def commit_verified_states(
    rec_pool: torch.Tensor,  # [L, N, H, Dk, Dv]
    conv_pool: torch.Tensor,  # [L, N, C, K-1]
    rec_inter: torch.Tensor,  # [L, B, T, H, Dk, Dv]
    conv_inter: torch.Tensor,  # [L, B, T, C, K-1]
    working_slots: torch.Tensor,  # [B]
    commit_steps: torch.Tensor,  # [B] step to commit into the working slot (commit_len - 1)
    track_slots: torch.Tensor,  # [B]
    track_steps: torch.Tensor,  # [B] step to copy into the tracking slot, -1 = none
) -> None:
    """After verification: commit each request's accepted step and, if due, its checkpoint."""
    if use_triton(rec_pool):
        from engine.kernels.state_scatter_triton import state_scatter_triton

        state_scatter_triton(
            rec_pool, conv_pool, rec_inter, conv_inter, working_slots, commit_steps, track_slots, track_steps
        )
        return
    from engine.kernels.state_scatter_naive import state_scatter_naive

    state_scatter_naive(
        rec_pool, conv_pool, rec_inter, conv_inter, working_slots, commit_steps, track_slots, track_steps
    )


__all__ = [
    "causal_conv1d", "causal_conv1d_verify", "conv_pool_forward", "conv_window_at", "gdn_chunk", "gdn_pool_forward",
    "gdn_recurrent", "gdn_verify", "set_force_torch", "commit_verified_states", "use_triton",
]
