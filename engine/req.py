"""Req: the scheduler's mutable state for one request.

Two views of a request, as in SGLang's overlap scheduler: what the device has
done (`seq_len`, `pending`, `generated`: advanced when a step runs) and what the
host has processed (`out`, the tracking bookkeeping, the radix tree: advanced
when the step's result is processed, one step later under overlap scheduling).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.cache.radix import Node
from engine.io_struct import GenerateOutput, GenerateRequest


@dataclass(eq=False)
class Req:
    req: GenerateRequest
    out: GenerateOutput  # host view: what has been processed and reported
    pages: list[int] = field(default_factory=list)  # KV page table (radix-owned prefix pages first)
    own_pages_from: int = 0  # pages[:own_pages_from] belong to the radix tree (SGLang's cache_protected_len)
    working_slot: int | None = None
    # extra_buffer tracking: two ping-pong checkpoint slots; the next checkpoint goes to
    # track_slots[next_track_idx], so the other one holds the last checkpoint taken
    track_slots: list[int] = field(default_factory=list)
    next_track_idx: int = 0
    last_track_seqlen: int | None = None  # length of the checkpoint not yet in the tree (None: none)
    branching_len: int | None = None  # SGLang's mamba_branching_seqlen, from the admission match
    prefix_node: Node | None = None  # the radix node this request holds locked
    # device view
    seq_len: int = 0  # tokens whose KV and linear state are committed
    pending: int | None = None  # last sampled token, not yet run through the model
    generated: list[int] = field(default_factory=list)  # every sampled token, processed or not
    device_finished: bool = False  # the sampled tokens already end the request
    verify_steps: int = 0  # verify steps run (the scripted drafter cycles on it)
    generator: torch.Generator | None = None
    aborted: str | None = None

    @property
    def rid(self) -> str:
        return self.req.rid

    @property
    def prompt(self) -> tuple[int, ...]:
        return self.req.input_ids

    @property
    def in_prefill(self) -> bool:
        return self.seq_len < len(self.req.input_ids)

    def tokens(self) -> list[int]:
        """Prompt + processed output tokens (the last one may not have run through the model)."""
        return list(self.req.input_ids) + self.out.output_ids

    @property
    def max_len(self) -> int:
        return len(self.req.input_ids) + self.req.sampling.max_new_tokens

    def note_fault(self, tainted: set[int]) -> None:
        """With a fault injected: r reports it reached it once its working state carries a fault mark
        (StatePool.tainted)."""
        if self.out.injected_fault_hit is not None and self.working_slot in tainted:
            self.out.injected_fault_hit = True

    @property
    def next_track_slot(self) -> int:
        """The ping-pong slot the next checkpoint is written to."""
        return self.track_slots[self.next_track_idx]

    @property
    def last_track_slot(self) -> int:
        """The ping-pong slot holding the last checkpoint taken (what the tree receives)."""
        return self.track_slots[1 - self.next_track_idx]
