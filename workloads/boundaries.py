"""Track-interval boundary arithmetic shared by the workload generators.

A boundary is a positive multiple of the track interval I: the lengths at which
the extra_buffer strategy checkpoints the linear-attention state.
"""

from __future__ import annotations

DEFAULT_INTERVALS = (128, 256)
DEFAULT_BLOCK_SIZE = 8  # DFlash block size B: drafts per verify step
CONTEXT_TOKENS = 2048  # the built-in engine's context (max_position_embeddings)
MAX_TURN0_TOKENS = 1100  # turn-0 prompts stay here so follow-up turns fit the context


def next_boundary(length: int, interval: int) -> int:
    """The first boundary strictly above `length` (a prompt on a boundary gets the next one)."""
    return (length // interval + 1) * interval


def boundaries_upto(length: int, interval: int) -> int:
    """How many boundaries lie in (0, length]: the checkpoints a sequence of `length` tokens passes."""
    return length // interval

