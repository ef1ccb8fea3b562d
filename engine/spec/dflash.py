"""DFlash speculative worker: draft a block, verify it in one target forward, commit states.

Per step and request: block = [anchor, d_1 .. d_{B-1}] at positions
seq_len .. seq_len+B-1. The target runs the block with linear-state updates
disabled, keeping every intermediate state. The accepted prefix plus a bonus
token is emitted; `commit_len = accept_len + 1` block tokens become part of
the sequence. Then (DESIGN.md section 1):

* working state  <- intermediate step commit_len - 1
* tracking slot  <- intermediate step `mamba_steps_to_track(pre, post, ...)`

Attention KV past the commit needs no rollback in a paged pool: positions
beyond seq_len are never read and the next block overwrites them.
"""

from __future__ import annotations

import torch

from engine.faults import CONV_NOT_TRACKED, STALE_SEQ_LENS, TRACK_OFF_BY_ONE, active
from engine.req import Req
from engine.sampling import GREEDY_BELOW, probs
from engine.spec.accept import greedy_accept_len, rejection_sample
from engine.spec.scripted import scripted_drafts
from engine.spec.tracking import mamba_steps_to_track
from protocol.boundaries import crossed, crossed_boundary
from protocol.tokenizer import MASK_ID


class DFlashWorker:
    def __init__(self, cfg, runner, scheduler):
        self.cfg, self.runner, self.sched = cfg, runner, scheduler
        self.block = cfg.speculative_num_draft_tokens

    def _drafts(self, reqs: list[Req]) -> list[list[int]]:
        if self.cfg.drafter_mode == "scripted":
            return [scripted_drafts(self.runner, r, self.block, self.cfg.scripted_accept) for r in reqs]
        logits = self.runner.draft([r.pending for r in reqs], [r.seq_len for r in reqs], [r.pages for r in reqs],
                                   self.block, MASK_ID)  # [B, block, V]
        return logits[:, 1:].argmax(-1).tolist()

    def step(self, reqs: list[Req]) -> None:
        """One draft + verify + commit for every request in the decode batch."""
        drafts = self._drafts(reqs)
        blocks = [[r.pending] + d for r, d in zip(reqs, drafts, strict=True)]
        starts = [r.seq_len for r in reqs]
        logits = self.runner.verify(blocks, starts, [r.pages for r in reqs], [r.working_slot for r in reqs])
        commit_lens = [self._accept(r, d, lg) for r, d, lg in zip(reqs, drafts, logits, strict=True)]
        self._commit(reqs, starts, commit_lens)

    def _accept(self, r: Req, drafts: list[int], logits: torch.Tensor) -> int:
        """Emit accepted drafts + bonus (clipped by finish); returns commit_len."""
        sp = r.req.sampling
        if sp.temperature < GREEDY_BELOW:
            argmax = logits.argmax(-1).tolist()
            n = greedy_accept_len(drafts, argmax)
            emitted = drafts[:n] + [argmax[n]]
        else:
            emitted = rejection_sample(drafts, probs(logits, sp.temperature), r.generator)
        count = 0
        for i, tok in enumerate(emitted):
            count += 1
            if self.sched.append_token(r, tok, logits[i]):
                break
        return count

    def _commit(self, reqs: list[Req], starts: list[int], commit_lens: list[int]) -> None:
        I = self.cfg.mamba_track_interval
        tracking = self.sched.tracking
        posts = [p + c for p, c in zip(starts, commit_lens, strict=True)]
        steps = [-1] * len(reqs)
        if tracking:
            # #37817: the buggy worker compared against lengths that had not been advanced yet
            post_seen = starts if active(self.cfg, STALE_SEQ_LENS) else posts
            steps = mamba_steps_to_track(torch.tensor(starts, dtype=torch.int32), torch.tensor(post_seen),
                                         torch.tensor(commit_lens), I).tolist()
            if active(self.cfg, TRACK_OFF_BY_ONE):
                steps = [_off_by_one_step(p, q, c, I) for p, q, c in zip(starts, posts, commit_lens, strict=True)]
        track_slots = []
        for r, p, q in zip(reqs, starts, posts, strict=True):
            # scheduler bookkeeping from the real lengths, independent of the copy below
            boundary = crossed_boundary(p, q, I) if tracking else None
            track_slots.append(self.sched.record_track(r, boundary) if boundary is not None else r.working_slot)
        self.runner.commit_verify([r.working_slot for r in reqs], commit_lens, track_slots, steps,
                                  conv_tracked=not active(self.cfg, CONV_NOT_TRACKED))
        for r, p, c, s in zip(reqs, starts, commit_lens, steps, strict=True):
            r.seq_len = p + c
            r.out.spec_verify_ct += 1
            r.out.spec_trace.append((p, c, int(s)))
            self.sched.counters["verify_steps"] += 1


def _off_by_one_step(pre: int, post: int, commit_len: int, interval: int) -> int:
    """The track-off-by-one fault: the boundary's token count used as a step index (no -1)."""
    if not crossed(pre, post, interval):
        return -1
    step = crossed_boundary(pre, post, interval) - pre
    return step if step < commit_len else -1
