"""DFlash speculative worker: draft a block, verify it in one target forward, commit states.

Per step and request: block = [anchor, d_1 .. d_{B-1}] at positions
seq_len .. seq_len+B-1. The target runs the block with linear-state updates
disabled, keeping every intermediate state. The accepted prefix plus a bonus
token is emitted; `commit_len = accept_len + 1` block tokens become part of
the sequence. Then (DESIGN.md section 1):

* working state  <- intermediate step commit_len - 1
* tracking slot  <- intermediate step `mamba_steps_to_track(pre, post, ...)`

This is the device side of a step (SGLang's `dflash_worker_v2.forward_batch_generation`):
it advances the requests' device view and returns what the host will process
(one step later under overlap scheduling), where the boundary is recorded from
the real lengths. Attention KV past the commit needs no rollback in a paged
pool: positions beyond seq_len are never read and the next block overwrites them.
"""

from __future__ import annotations

import torch

from engine.faults import CONV_NOT_TRACKED, CONV_ROLLBACK_WRONG_STEP, STALE_SEQ_LENS, TRACK_OFF_BY_ONE, active
from engine.req import Req
from engine.sampling import GREEDY_BELOW, block_logits, probs
from engine.schedule_batch import ReqResult
from engine.spec.accept import greedy_accept_len, rejection_sample
from engine.spec.scripted import scripted_drafts
from engine.spec.tracking import mamba_steps_to_track
from engine.stopping import take_until_finished
from protocol.boundaries import crossed, crossed_boundary
from protocol.tokenizer import MASK_ID


class DFlashWorker:
    def __init__(self, cfg, runner):
        self.cfg, self.runner = cfg, runner
        self.block = cfg.speculative_num_draft_tokens

    def _drafts(self, reqs: list[Req]) -> list[list[int]]:
        if self.cfg.drafter_mode == "scripted":
            return [scripted_drafts(self.runner, r, self.block, self.cfg.scripted_accept) for r in reqs]
        logits = self.runner.draft([r.pending for r in reqs], [r.seq_len for r in reqs], [r.pages for r in reqs],
                                   self.block, MASK_ID)  # [B, block, V]
        return logits[:, 1:].argmax(-1).tolist()

    def run(self, reqs: list[Req], track_slots: list[int] | None) -> list[ReqResult]:
        """One draft + verify + commit for every request of the decode batch.

        `track_slots[b]` is where row b's checkpoint goes if its step crosses a boundary;
        None when the step has no tracking indices (then nothing is copied).
        """
        drafts = self._drafts(reqs)
        blocks = [[r.pending] + d for r, d in zip(reqs, drafts, strict=True)]
        starts = [r.seq_len for r in reqs]
        logits = self.runner.verify(blocks, starts, [r.pages for r in reqs], [r.working_slot for r in reqs])
        results = [self._accept(r, p, d, lg) for r, p, d, lg in zip(reqs, starts, drafts, logits, strict=True)]
        self._commit(reqs, results, track_slots)
        return results

    def _accept(self, r: Req, pre: int, drafts: list[int], logits: torch.Tensor) -> ReqResult:
        """Accepted drafts + bonus, cut where the request finishes; advances r's device view."""
        sp = r.req.sampling
        rows = block_logits(logits, sp, r.generated, drafts)  # penalties and bans as decoding would see them
        if sp.temperature < GREEDY_BELOW:
            argmax = rows.argmax(-1).tolist()
            n = greedy_accept_len(drafts, argmax)
            emitted = drafts[:n] + [argmax[n]]
        else:
            emitted = rejection_sample(drafts, probs(rows, sp), r.generator)
        discarded = r.device_finished  # an overlapped step of a request that already ended: run, then discard
        if discarded:
            keep, finish = len(emitted), None
        else:
            keep, finish = take_until_finished(r.generated, emitted, sp)
            r.generated.extend(emitted[:keep])
            r.device_finished = finish is not None
        r.seq_len, r.pending = pre + keep, emitted[keep - 1]
        r.verify_steps += 1
        return ReqResult(r, pre, emitted[:keep], logits[:keep], finish, commit_len=keep, discarded=discarded)

    def _commit(self, reqs: list[Req], results: list[ReqResult], track_slots: list[int] | None) -> None:
        I = self.cfg.mamba_track_interval
        starts = [res.pre_len for res in results]
        commit_lens = [res.commit_len for res in results]
        posts = [p + c for p, c in zip(starts, commit_lens, strict=True)]
        steps = [-1] * len(reqs)
        if self.cfg.tracking and track_slots is not None:
            # #37817: the buggy worker compared against lengths that had not been advanced yet
            post_seen = starts if active(self.cfg, STALE_SEQ_LENS) else posts
            steps = mamba_steps_to_track(torch.tensor(starts, dtype=torch.int32), torch.tensor(post_seen),
                                         torch.tensor(commit_lens), I).tolist()
            if active(self.cfg, TRACK_OFF_BY_ONE):
                steps = [_off_by_one_step(p, q, c, I) for p, q, c in zip(starts, posts, commit_lens, strict=True)]
        conv_steps = None
        if active(self.cfg, CONV_ROLLBACK_WRONG_STEP):
            # partial acceptance: the conv window is rolled back to one step past the last accepted token
            conv_steps = [c if c < self.block else c - 1 for c in commit_lens]
        working = [r.working_slot for r in reqs]
        self.runner.commit_verify(working, commit_lens, track_slots or working, steps,
                                  conv_tracked=not active(self.cfg, CONV_NOT_TRACKED), conv_commit_steps=conv_steps)
        for res, s in zip(results, steps, strict=True):
            res.tracked_step = int(s)
        if self.cfg.inject_fault:
            self._mark_faults(reqs, track_slots, steps, starts, posts, commit_lens, conv_steps)

    def _mark_faults(self, reqs: list[Req], track_slots: list[int] | None, steps: list[int], starts: list[int],
                     posts: list[int], commit_lens: list[int], conv_steps: list[int] | None) -> None:
        """The fault marks of this commit (StatePool.tainted): a checkpoint it wrote, or should have written,
        carries its request's mark, or one of its own where a fault wrote it from the wrong step, without its
        conv window, or not at all; a working conv window committed from the wrong step marks the request's working
        state, which the next step reads."""
        st = self.runner.caches.state
        right = (mamba_steps_to_track(torch.tensor(starts, dtype=torch.int32), torch.tensor(posts),
                                      torch.tensor(commit_lens), self.cfg.mamba_track_interval).tolist()
                 if self.cfg.tracking else [-1] * len(reqs))
        conv_tracked = not active(self.cfg, CONV_NOT_TRACKED)
        for b, r in enumerate(reqs):
            if right[b] >= 0 and r.track_slots:
                slot = track_slots[b] if track_slots is not None else r.next_track_slot
                wrong = track_slots is None or steps[b] != right[b] or not conv_tracked
                st.carry(r.working_slot, slot, corrupt=wrong)
            if conv_steps is not None and conv_steps[b] != commit_lens[b] - 1:
                st.tainted.add(r.working_slot)  # r reports it at its next step (Scheduler._carry_kv_marks)


def _off_by_one_step(pre: int, post: int, commit_len: int, interval: int) -> int:
    """The track-off-by-one fault: the boundary's token count used as a step index (no -1)."""
    if not crossed(pre, post, interval):
        return -1
    step = crossed_boundary(pre, post, interval) - pre
    return step if step < commit_len else -1
