"""Linear-state pool: per GDN layer a recurrent state and a conv window per slot.

A slot is either a running request's working state, one of its tracking
slots (checkpoints taken at track-interval boundaries), or a checkpoint owned
by the radix tree.
"""

from __future__ import annotations

import torch


class StatePool:
    def __init__(self, num_layers: int, num_slots: int, num_v_heads: int, head_k_dim: int, head_v_dim: int,
                 conv_dim: int, conv_kernel: int, device: str | torch.device = "cpu"):
        self.num_slots = num_slots
        # fp32 states, whatever the activation dtype: the recurrence accumulates
        self.rec = torch.zeros(num_layers, num_slots, num_v_heads, head_k_dim, head_v_dim, device=device)
        self.conv = torch.zeros(num_layers, num_slots, conv_dim, conv_kernel - 1, device=device)
        self._free = list(range(num_slots - 1, -1, -1))

    @property
    def free_slots(self) -> int:
        return len(self._free)

    @property
    def used_slots(self) -> int:
        return self.num_slots - len(self._free)

    def alloc(self, n: int = 1) -> list[int] | None:
        """n free slots (bookkeeping only: the runner zeroes them, on every rank), or None."""
        if n > len(self._free):
            return None
        return [self._free.pop() for _ in range(n)]

    def zero(self, slots: list[int]) -> None:
        """A fresh sequence starts from the zero state."""
        idx = torch.tensor(slots, dtype=torch.long)
        self.rec[:, idx] = 0
        self.conv[:, idx] = 0

    def free(self, slots: list[int]) -> None:
        if not slots:
            return
        self._free.extend(slots)
        self._free.sort(reverse=True)
        assert len(self._free) == len(set(self._free)) <= self.num_slots, "state slot freed twice"

    def copy(self, src: int, dst: int) -> None:
        """Checkpoint: dst <- src for every layer (recurrent state and conv window together)."""
        self.rec[:, dst] = self.rec[:, src]
        self.conv[:, dst] = self.conv[:, src]
