"""Tensor-parallel context: which shard this process holds and how to all-reduce.

Sharding scheme (Megatron style): column-parallel projections split output
features by head, row-parallel projections split input features and all-reduce
their partial sums. The embedding / LM head and all norms are replicated.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TPContext:
    """This rank's place in its replica's tensor-parallel group."""

    size: int = 1
    rank: int = 0

    def shard(self, n: int, what: str) -> int:
        """The local share of `n` (heads, features), which must divide evenly."""
        if n % self.size:
            raise ValueError(f"{what} ({n}) is not divisible by tp_size ({self.size})")
        return n // self.size

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.size > 1:
            dist.all_reduce(x)
        return x


SINGLE = TPContext()
