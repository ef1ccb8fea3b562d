"""Torch reference of the post-verify state commit (the Triton kernel: state_scatter_triton.py)."""

from __future__ import annotations

import torch


def state_scatter_naive(
    rec_pool: torch.Tensor, conv_pool: torch.Tensor, rec_inter: torch.Tensor, conv_inter: torch.Tensor,
    working_slots: torch.Tensor, commit_steps: torch.Tensor, track_slots: torch.Tensor,
    track_steps: torch.Tensor,
) -> None:
    """For every layer: pool[working] <- inter[commit_step]; pool[track] <- inter[track_step] where >= 0."""
    rows = torch.arange(working_slots.shape[0], device=working_slots.device)
    commit_steps = commit_steps.long()
    track_steps = track_steps.long()
    rec_pool[:, working_slots.long()] = rec_inter[:, rows, commit_steps].to(rec_pool.dtype)
    conv_pool[:, working_slots.long()] = conv_inter[:, rows, commit_steps].to(conv_pool.dtype)
    due = track_steps >= 0
    if bool(due.any()):
        r, steps, dst = rows[due], track_steps[due], track_slots.long()[due]
        rec_pool[:, dst] = rec_inter[:, r, steps].to(rec_pool.dtype)
        conv_pool[:, dst] = conv_inter[:, r, steps].to(conv_pool.dtype)
