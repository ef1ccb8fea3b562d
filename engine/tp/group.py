"""Tensor-parallel context: which shard this process holds and how to all-reduce.

Sharding scheme (Megatron style): column-parallel projections split output
features by head, row-parallel projections split input features and all-reduce
their partial sums. The embedding / LM head and all norms are replicated.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist


class Group:
    """One replica's communicator: a gloo process group of its own (no global default group).

    Owning the group (instead of torch.distributed's process-wide default) lets one
    process hold several replicas, as tests do. On CUDA a NCCL group would take its place.
    """

    def __init__(self, rank: int, size: int, addr: str, port: int, timeout_s: float):
        timeout = timedelta(seconds=timeout_s)
        self.store = dist.TCPStore(addr, port, size, is_master=rank == 0, timeout=timeout)
        self.pg = dist.ProcessGroupGloo(self.store, rank, size, timeout)
        self.rank, self.size = rank, size

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        self.pg.allreduce([x]).wait()
        return x

    def broadcast_object(self, obj=None):
        """Rank 0 sends obj (pickled), every other rank receives and returns it."""
        if self.rank == 0:
            data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
            n = torch.tensor([data.numel()], dtype=torch.long)
        else:
            n = torch.zeros(1, dtype=torch.long)
        self.pg.broadcast(n, 0).wait()
        if self.rank != 0:
            data = torch.empty(int(n), dtype=torch.uint8)
        self.pg.broadcast(data, 0).wait()
        return obj if self.rank == 0 else pickle.loads(data.numpy().tobytes())


@dataclass(frozen=True)
class TPContext:
    """This rank's place in its replica's tensor-parallel group."""

    size: int = 1
    rank: int = 0
    group: Group | None = field(default=None, compare=False, repr=False)

    def shard(self, n: int, what: str) -> int:
        """The local share of `n` (heads, features), which must divide evenly."""
        if n % self.size:
            raise ValueError(f"{what} ({n}) is not divisible by tp_size ({self.size})")
        return n // self.size

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.size > 1:
            self.group.all_reduce(x)
        return x


SINGLE = TPContext()
