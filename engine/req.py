"""Req: the scheduler's mutable state for one request."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.cache.radix import Node
from engine.io_struct import GenerateOutput, GenerateRequest


@dataclass(eq=False)
class Req:
    req: GenerateRequest
    out: GenerateOutput
    pages: list[int] = field(default_factory=list)  # KV page table (shared prefix pages first)
    own_pages_from: int = 0  # pages[:own_pages_from] belong to the radix tree
    working_slot: int | None = None
    track_slots: list[int] = field(default_factory=list)  # ping-pong checkpoint slots
    track_count: int = 0  # how many checkpoints were taken (selects the ping-pong slot)
    last_track_seqlen: int = 0  # scheduler's record of the last checkpointed boundary
    last_track_slot: int | None = None
    prefix_node: Node | None = None
    seq_len: int = 0  # tokens whose KV and linear state are committed
    pending: int | None = None  # last sampled token, not yet run through the model
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
        """Prompt + generated tokens (the last one is `pending`)."""
        return list(self.req.input_ids) + self.out.output_ids

    @property
    def max_len(self) -> int:
        return len(self.req.input_ids) + self.req.sampling.max_new_tokens

    def next_track_slot(self) -> int:
        return self.track_slots[self.track_count % len(self.track_slots)]
