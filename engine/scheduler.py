"""Scheduler: admission, the step plan, checkpoint bookkeeping, cleanup. No tensor math.

It decides which requests run and where each step's checkpoints go, owns page
tables and state slots (through TreeCache), and, when a step's result is
processed (engine/output_processor.py), records `last_track_seqlen` from the
real sequence lengths. As in SGLang, that record is kept independently of the
device's copy into the tracking slot: when the copy is skipped (bug #37817)
nothing here notices, which is exactly why the bug was silent.

Where checkpoints are taken follows SGLang (docs/engine.md has the table):
one per prefill extend, at the deepest position on the mamba cache chunk grid
(`protocol.boundaries.prefill_track_position`), decided when the extend is
planned; decode/verify ones at multiples of the track interval, recorded when
their result is processed.
"""

from __future__ import annotations

import math
from collections import deque

import torch

from engine.config import EngineConfig
from engine.faults import (
    EVICT_MATCHED_CHECKPOINT,
    PREFILL_CHECKPOINT_OFF_BOUNDARY,
    TRACK_DROPPED_ON_BATCH_CHANGE,
    active,
)
from engine.io_struct import GenerateOutput, GenerateRequest
from engine.output_processor import OutputProcessorMixin
from engine.req import Req
from engine.schedule_batch import DecodeBatch, PrefillChunk, ScheduleBatch
from engine.tree_cache import TreeCache, max_prefix_len
from protocol.boundaries import branching_point, chunk_extend_len, mamba_cache_chunk_size, prefill_track_position


class CapacityError(ValueError):
    """A request that can never fit in this engine's pools or context."""


class Scheduler(OutputProcessorMixin):
    def __init__(self, cfg: EngineConfig, runner, max_context: int):
        self.cfg, self.runner = cfg, runner
        self.tree = TreeCache(cfg, runner)
        self.kv, self.state, self.radix = self.tree.kv, self.tree.state, self.tree.radix
        self.max_context = max_context
        self.tracking = cfg.tracking
        self.interval = cfg.mamba_track_interval
        self.chunk = mamba_cache_chunk_size(cfg.page_size)
        self.overshoot = cfg.tokens_per_step
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.running_batch = DecodeBatch()
        self.counters = dict(requests=0, prompt_tokens=0, generation_tokens=0, cached_tokens=0, verify_steps=0,
                             accepted_tokens=0, finished=0, aborted=0)

    # --- admission ----------------------------------------------------------
    def pages_needed(self, req: GenerateRequest) -> int:
        # + one step's tokens: a block may run past the last kept token, and under overlap scheduling
        # a finished request runs one more step before its result is seen
        return math.ceil((len(req.input_ids) + req.sampling.max_new_tokens + self.overshoot) / self.cfg.page_size)

    def slots_needed(self) -> int:
        return 1 + (2 if self.tracking else 0)

    def check_fits(self, req: GenerateRequest) -> None:
        """Raise CapacityError if the request could never run here."""
        total = len(req.input_ids) + req.sampling.max_new_tokens
        if not req.input_ids:
            raise CapacityError("input_ids is empty")
        if total > self.max_context:
            raise CapacityError(f"prompt ({len(req.input_ids)} tokens) + max_new_tokens "
                                f"({req.sampling.max_new_tokens}) = {total} exceeds the context length "
                                f"{self.max_context}")
        if self.pages_needed(req) > self.kv.num_pages:
            raise CapacityError(f"request needs {self.pages_needed(req)} KV pages, the pool has {self.kv.num_pages}")

    def add(self, req: GenerateRequest) -> Req:
        self.check_fits(req)
        out = GenerateOutput(rid=req.rid, prompt_tokens=len(req.input_ids),
                             injected_fault_hit=False if self.cfg.inject_fault else None)
        if req.scores_prompt:  # filled as the prefill computes the positions (Executor._extend)
            scored = len(req.input_ids) - req.logprob_start_len
            out.input_logprobs = [None] * scored
            out.input_top_logprobs = [[] for _ in range(scored)] if req.top_logprobs_num else []
        r = Req(req=req, out=out)
        seed = req.sampling.seed if req.sampling.seed is not None else self.cfg.seed
        r.generator = torch.Generator().manual_seed(seed)
        self.waiting.append(r)
        self.counters["requests"] += 1
        self.counters["prompt_tokens"] += len(req.input_ids)
        return r

    def admit(self) -> list[Req]:
        """Move waiting requests into running while pools allow (FIFO; head-of-line waits)."""
        admitted = []
        while self.waiting and len(self.running) < self.cfg.max_running_requests:
            r = self.waiting[0]
            match = self.tree.match(list(r.prompt), max_prefix_len(r.req))
            cached = match.cached_len if match else 0
            # SGLang locks the matched node before anything can evict (_match_post_processor)
            lock_late = match is not None and active(self.cfg, EVICT_MATCHED_CHECKPOINT)
            if match is not None and not lock_late:
                self.radix.lock(match.node)
            pages = self.tree.alloc_pages(self.pages_needed(r.req) - cached // self.cfg.page_size)
            slots = self.tree.alloc_slots(self.slots_needed()) if pages is not None else None
            if lock_late:
                self.radix.lock(match.node)  # too late: the allocation above may have evicted its checkpoint
            if pages is None or slots is None:
                self.kv.free(pages or [])
                if match is not None:
                    self.radix.unlock(match.node)
                break
            self.waiting.popleft()
            self._start(r, match, pages, slots)
            admitted.append(r)
        return admitted

    def _start(self, r: Req, match, pages: list[int], slots: list[int]) -> None:
        cached = match.cached_len if match else 0
        r.pages = list(match.pages if match else ()) + pages
        r.own_pages_from = cached // self.cfg.page_size
        r.working_slot, r.track_slots = slots[0], slots[1:]
        self.runner.zero_states(slots)
        r.prefix_node = match.node if match else None
        if cached:
            self.runner.copy_state(match.checkpoint, r.working_slot)
            self.state.carry(match.checkpoint, r.working_slot, corrupt=self._restore_wrong(match, pages, slots))
            r.note_fault(self.state.tainted)
        if match is not None and self.tracking:
            r.branching_len = branching_point(match.kv_len, cached, self.chunk)
        r.seq_len = cached
        r.out.cached_tokens = cached
        self.counters["cached_tokens"] += cached
        self.running.append(r)

    def _restore_wrong(self, match, pages: list[int], slots: list[int]) -> bool:
        """With a fault injected: whether a restore resumes from other than the matched prefix's own KV and state:
        the admission's allocation evicted the matched node and may hand its pages to anyone, or handed the
        checkpoint's slot or a matched page back to the request itself (evict-matched-checkpoint); or the state is
        a shallower node's under a deeper node's KV (match-past-checkpoint). An evicted checkpoint whose slot no
        one took yet is copied intact."""
        if not self.cfg.inject_fault:
            return False
        node, ps = match.node, self.cfg.page_size
        while node.parent is not None:
            if node.parent.children.get(node.key[:ps]) is not node:
                return True
            node = node.parent
        if match.checkpoint in slots or set(match.pages) & set(pages):
            return True
        holder = match.node
        while holder is not None and holder.checkpoint != match.checkpoint:
            holder = holder.parent
        return holder is not None and holder is not match.node

    # --- the step plan ------------------------------------------------------
    def schedule(self) -> ScheduleBatch:
        """Plan one step: prefill chunks (with their checkpoints) and the decode/verify rows."""
        for r in self.running:
            if r.in_prefill and r.last_track_seqlen is not None:
                # SGLang caches a chunked request's prefix before scheduling its next chunk
                self.tree.cache_unfinished_req(r)
        self.admit()
        prefill = self._plan_prefill()
        decode, track_slots = self._prepare_decode()
        batch = ScheduleBatch(prefill, decode, track_slots)
        if self.cfg.inject_fault:
            self._carry_kv_marks(batch)
        return batch

    def _carry_kv_marks(self, batch: ScheduleBatch) -> None:
        """With a fault injected, the marks of what this step's attention reads (KVPool.tainted): a step that
        reads a marked page, or runs from a marked working state, computes wrong hidden states, so the pages it
        writes are marked and so is its request (its working state, and the prefill checkpoint the step takes),
        which reports the hit from this step on (a working state marked after a request's last step changed
        nothing it returns); a page a step writes while another running request still reads it (a matched prefix
        an eviction freed under it and handed out again: evict-matched-checkpoint) marks that request."""
        def pages(r: Req, start: int, end: int) -> tuple[Req, list[int], list[int]]:
            """r, the pages its step reads (its prefix through `end`) and those it writes ([start, end))."""
            last = math.ceil(end / self.cfg.page_size)
            return r, r.pages[:last], r.pages[start // self.cfg.page_size : last]

        spans = [(*pages(c.req, c.start, c.end), c.track_slot if c.track_len is not None else None)
                 for c in batch.prefill]
        # a row whose request already ended runs an overlapped step whose result is discarded: it reads nothing
        spans += [(*pages(r, r.seq_len, r.seq_len + self.overshoot), None)
                  for r in batch.decode if not r.device_finished]
        writer = {p: r for r, _, written, _ in spans for p in written}
        for r in self.running:
            if not r.device_finished and any(writer.get(p, r) is not r for p in r.pages):
                self.state.tainted.add(r.working_slot)  # its prefix's KV is overwritten under it
                r.note_fault(self.state.tainted)
        for r, read, written, track in spans:
            if r.working_slot in self.state.tainted or not self.kv.tainted.isdisjoint(read):
                self.state.tainted.add(r.working_slot)
                if track is not None:
                    self.state.tainted.add(track)
                self.kv.tainted.update(written)
                r.note_fault(self.state.tainted)

    def _plan_prefill(self) -> list[PrefillChunk]:
        budget = self.cfg.chunked_prefill_size
        chunks = []
        for r in self.running:
            if not r.in_prefill or r.aborted is not None:
                continue
            n = chunk_extend_len(len(r.prompt) - r.seq_len, budget, self.cfg.page_size)
            if n <= 0:
                break
            chunks.append(self._prefill_chunk(r, r.seq_len, r.seq_len + n))
            budget -= n
        return chunks

    def _prefill_chunk(self, r: Req, start: int, end: int) -> PrefillChunk:
        """SGLang's _mamba_radix_cache_v2_req_prepare_for_extend: this extend's checkpoint, if any."""
        pos = prefill_track_position(start, end - start, self.chunk, r.branching_len) if self.tracking else None
        if pos is None:
            return PrefillChunk(r, start, end)
        slot = r.next_track_slot
        r.next_track_idx = 1 - r.next_track_idx
        r.last_track_seqlen = pos
        offset = pos - start
        if active(self.cfg, PREFILL_CHECKPOINT_OFF_BOUNDARY):
            offset = end - start  # the backend reads the extend's final state, not the chunk state at pos
        self.state.carry(r.working_slot, slot, corrupt=offset != pos - start)  # what the extend will write there
        return PrefillChunk(r, start, end, pos, slot, offset)

    def _prepare_decode(self) -> tuple[list[Req], list[int] | None]:
        """Filter the running batch, merge newly prefilled requests, and set each row's tracking slot."""
        batch = self.running_batch
        live = {id(r) for r in self.running}
        batch.filter(lambda r: id(r) in live and not r.out.finished)
        rows = {id(r) for r in batch.reqs}
        batch.merge([r for r in self.running
                     if id(r) not in rows and not r.in_prefill and r.pending is not None and not r.out.finished])
        dropped = batch.track_slots is None
        batch.prepare_track()
        if dropped and self.cfg.speculative and active(self.cfg, TRACK_DROPPED_ON_BATCH_CHANGE):
            return list(batch.reqs), None  # #39342: the verify ran with the indices filter/merge dropped
        return list(batch.reqs), list(batch.track_slots)

    # --- completion ---------------------------------------------------------
    def abort(self, rid: str, message: str = "aborted by client") -> bool:
        for r in list(self.waiting):
            if r.rid == rid:
                self.waiting.remove(r)
                r.out.finished = True
                r.out.finish_reason = {"type": "abort", "message": message}
                self.counters["aborted"] += 1
                return True
        for r in self.running:
            if r.rid == rid:
                r.aborted = message
                return True
        return False

    def reap(self) -> list[Req]:
        """Release finished and aborted running requests (SGLang's cache_finished_req); returns them."""
        done = []
        for r in list(self.running):
            if r.aborted is not None and not r.out.finished:
                r.out.finished = True
                r.out.finish_reason = {"type": "abort", "message": r.aborted}
                self.counters["aborted"] += 1
            if r.out.finished:
                self.tree.cache_finished_req(r, cache=r.aborted is None)
                self.running.remove(r)
                self.counters["finished"] += 1
                done.append(r)
        return done

    def flush(self) -> bool:
        """Empty the radix cache; refused (False) while requests are running or waiting."""
        if self.running or self.waiting:
            return False
        self.tree.flush()
        return True
