"""What one engine step runs and what it produced: plain data between the scheduler and the device.

`ScheduleBatch` is planned on the host (scheduler), run on the device
(`engine.executor`), and its `BatchResult` is processed on the host again, one
step later under overlap scheduling. `DecodeBatch` is the running batch that
persists across steps, as SGLang's `running_batch` does: requests leave it
(filter) and join it (merge), and the per-row tracking slots must stay aligned
with its rows through both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.req import Req


@dataclass(frozen=True)
class PrefillChunk:
    """Prompt tokens [start, end) of one request, and the prefill checkpoint it takes (if any)."""

    req: Req
    start: int
    end: int
    track_len: int | None = None  # the length this extend's checkpoint is recorded at (None: none)
    track_slot: int = -1  # the ping-pong slot it is written to
    track_offset: int = -1  # tokens into this extend whose state the slot receives (track_len - start)

    @property
    def last(self) -> bool:
        """This chunk ends the prompt, so it samples the first output token."""
        return self.end == len(self.req.prompt)


class DecodeBatch:
    """The running decode/verify batch: its requests and, per row, the slot a checkpoint goes to.

    Like SGLang's ScheduleBatch, `filter` and `merge` change the rows and drop the tracking
    indices (`track_slots = None`); `prepare_track` rebuilds them from the requests' ping-pong
    state before the step runs. A step that ran with the dropped indices would skip its
    checkpoint copies while the host still records the boundaries (SGLang #39342).
    """

    def __init__(self) -> None:
        self.reqs: list[Req] = []
        self.track_slots: list[int] | None = []

    def filter(self, keep) -> bool:
        """Keep the rows whose request satisfies `keep`; returns True if any row left."""
        kept = [r for r in self.reqs if keep(r)]
        changed = len(kept) != len(self.reqs)
        if changed:
            self.reqs, self.track_slots = kept, None
        return changed

    def merge(self, reqs: list[Req]) -> bool:
        """Append rows for `reqs`; returns True if any joined."""
        if reqs:
            self.reqs, self.track_slots = self.reqs + list(reqs), None
        return bool(reqs)

    def prepare_track(self) -> None:
        """Rows' tracking slots from their requests: the ping-pong slot the next checkpoint goes to."""
        self.track_slots = [r.next_track_slot if r.track_slots else -1 for r in self.reqs]

    def __len__(self) -> int:
        return len(self.reqs)


@dataclass
class ScheduleBatch:
    """One step's work: prefill chunks, and the decode/verify rows (a snapshot of the running batch)."""

    prefill: list[PrefillChunk] = field(default_factory=list)
    decode: list[Req] = field(default_factory=list)
    track_slots: list[int] | None = None  # per decode row; None: the step's tracking indices were dropped

    def __bool__(self) -> bool:
        return bool(self.prefill or self.decode)


@dataclass
class ReqResult:
    """What the device produced for one request in one step."""

    req: Req
    pre_len: int  # committed length before the step
    tokens: list[int]  # sampled tokens the request keeps (empty for a prefill chunk that is not the last)
    logits: torch.Tensor | None  # [len(tokens), V], the distributions they were sampled from
    finish: dict | None = None  # the finish reason these tokens reach
    commit_len: int = 0  # verify: block tokens committed (accepted drafts + 1)
    tracked_step: int = -1  # verify: the intermediate step copied into the tracking slot (-1: none)
    discarded: bool = False  # the request had already finished on the device: an overlap step's extra run
    # a prefill chunk of a request scoring its prompt: (prompt position, log-prob of its token, top-k)
    prompt_scores: list[tuple[int, float, list[tuple[float, int]]]] = field(default_factory=list)


@dataclass
class BatchResult:
    """Everything one step produced, in the order of its batch."""

    prefill: list[tuple[PrefillChunk, ReqResult]] = field(default_factory=list)
    decode: list[ReqResult] = field(default_factory=list)
