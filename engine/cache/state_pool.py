"""Linear-state pool: per GDN layer a recurrent state and a conv window per slot.

A slot is either a running request's working state, one of its two ping-pong
tracking slots (checkpoints: prefill ones on the mamba chunk grid, decode/verify
ones at track-interval boundaries), or a checkpoint owned by the radix tree.

The recurrent state is stored in `ssm_dtype` (SGLang's `--mamba-ssm-dtype`:
float32, or bfloat16, whose rounding alone changes greedy tokens on cache hits,
SGLang PR #33515); the kernels always compute in fp32 and round when they store.
The conv window holds raw inputs and is stored in the activation dtype
(`conv_dtype`, the engine's `--dtype`), as SGLang's conv state follows the model
dtype, not the SSM one.

`tainted` is host bookkeeping for the fault injections (engine/faults.py), never read by the engine's own
logic: the slots whose state an injected fault corrupted, directly or by descent. A copy carries its source's
mark, a zeroed or newly allocated slot has none, and the code that a fault alters marks what it wrote wrong;
a request that resumes from a marked state reports it (`injected_fault_hit`, docs/engine.md), which is how a
noisy run knows which of its own turns a fault reached.
"""

from __future__ import annotations

import torch

from engine.cache.free_list import FreeList


class StatePool:
    def __init__(self, num_layers: int, num_slots: int, num_v_heads: int, head_k_dim: int, head_v_dim: int,
                 conv_dim: int, conv_kernel: int, device: str | torch.device = "cpu",
                 ssm_dtype: torch.dtype = torch.float32, conv_dtype: torch.dtype = torch.float32):
        self.num_slots = num_slots
        self.rec = torch.zeros(num_layers, num_slots, num_v_heads, head_k_dim, head_v_dim, dtype=ssm_dtype,
                               device=device)
        self.conv = torch.zeros(num_layers, num_slots, conv_dim, conv_kernel - 1, dtype=conv_dtype, device=device)
        self._slots = FreeList(num_slots, "state slot")
        self.tainted: set[int] = set()

    @property
    def free_slots(self) -> int:
        return self._slots.free

    @property
    def used_slots(self) -> int:
        return self._slots.used

    def alloc(self, n: int = 1) -> list[int] | None:
        """n free slots (bookkeeping only: the runner zeroes them, on every rank), or None."""
        slots = self._slots.alloc(n)
        self.tainted.difference_update(slots or ())
        return slots

    def zero(self, slots: list[int]) -> None:
        """A fresh sequence starts from the zero state."""
        idx = torch.tensor(slots, dtype=torch.long)
        self.rec[:, idx] = 0
        self.conv[:, idx] = 0
        self.tainted.difference_update(slots)

    def free(self, slots: list[int]) -> None:
        self._slots.release(slots)

    def copy(self, src: int, dst: int) -> None:
        """Checkpoint: dst <- src for every layer (recurrent state and conv window together)."""
        self.rec[:, dst] = self.rec[:, src]
        self.conv[:, dst] = self.conv[:, src]
        self.carry(src, dst)

    def carry(self, src: int, dst: int, corrupt: bool = False) -> None:
        """`dst` now holds a state computed from `src`'s (a copy, or a checkpoint taken on its way): it has
        src's fault mark, or one of its own if `corrupt` (the write itself was wrong)."""
        if corrupt or src in self.tainted:
            self.tainted.add(dst)
        else:
            self.tainted.discard(dst)
