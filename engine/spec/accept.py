"""Acceptance of a drafted block (pure functions)."""

from __future__ import annotations

import torch


def greedy_accept_len(drafts: list[int], target_argmax: list[int]) -> int:
    """Longest run of drafts d_1.. equal to the target's argmax at the preceding position."""
    n = 0
    for d, t in zip(drafts, target_argmax, strict=False):
        if d != t:
            break
        n += 1
    return n


def rejection_sample(drafts: list[int], target_probs: torch.Tensor, generator: torch.Generator) -> list[int]:
    """Speculative sampling with deterministic (one-hot) drafts.

    target_probs [B, V]: row i is the target distribution for the token after block
    position i. Draft d_{i+1} is kept with probability p_i(d); on rejection a token is
    drawn from p_i with d removed (the residual max(p - q, 0) for a one-hot q). Returns
    the accepted drafts plus one corrected or bonus token.
    """
    out: list[int] = []
    for i, d in enumerate(drafts):
        p = target_probs[i]
        if float(torch.rand((), generator=generator)) < float(p[d]):
            out.append(d)
            continue
        residual = p.clone()
        residual[d] = 0
        total = float(residual.sum())
        if total <= 0:  # p was one-hot on d: rejection had probability zero
            out.append(d)
            continue
        out.append(int(torch.multinomial(residual / total, 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(target_probs[len(drafts)], 1, generator=generator)))
    return out
