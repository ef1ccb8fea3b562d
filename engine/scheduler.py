"""Scheduler: admission, continuous batching, checkpoint bookkeeping, cleanup. No tensor math.

It decides which requests run, owns page tables and state slots, and records
`last_track_seqlen` from the real sequence lengths. As in SGLang, that record
is kept independently of the worker's copy into the tracking slot: when the
copy is skipped (bug #37817) nothing here notices, which is exactly why the bug
was silent.
"""

from __future__ import annotations

import math
from collections import deque

import torch

from engine.cache.radix import RadixCache
from engine.config import EngineConfig
from engine.faults import INSERT_WORKING_STATE, active
from engine.io_struct import GenerateOutput, GenerateRequest, SamplingParams
from engine.req import Req
from engine.sampling import logprob_info
from protocol.tokenizer import BYTE_TOKENIZER, EOS_ID


def stop_reason(token: int, output_ids: list[int], sp: SamplingParams) -> dict | None:
    """SGLang's `finish_reason` when `token` (just appended to `output_ids`) ends the request on a stop
    condition: EOS unless ignored, a stop token id, or a stop string in the recent text; else None."""
    if token == EOS_ID and not sp.ignore_eos:
        return {"type": "stop", "matched": token}
    if token in sp.stop_token_ids:
        return {"type": "stop", "matched": token}
    if sp.stop:
        text = BYTE_TOKENIZER.decode(output_ids[-64:])
        matched = next((s for s in sp.stop if s in text), None)
        if matched is not None:
            return {"type": "stop", "matched": matched}
    return None


class CapacityError(ValueError):
    """A request that can never fit in this engine's pools or context."""


class Scheduler:
    def __init__(self, cfg: EngineConfig, runner, max_context: int):
        self.cfg, self.runner = cfg, runner
        self.kv, self.state = runner.caches.kv, runner.caches.state
        self.max_context = max_context
        self.radix = RadixCache(self.kv, self.state, cfg.page_size) if cfg.radix_cache else None
        self.tracking = self.radix is not None and cfg.mamba_radix_cache_strategy == "extra_buffer"
        self.interval = cfg.mamba_track_interval
        self.overshoot = cfg.speculative_num_draft_tokens if cfg.speculative else 1
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.counters = dict(requests=0, prompt_tokens=0, generation_tokens=0, cached_tokens=0, verify_steps=0,
                             finished=0, aborted=0)

    # --- admission ----------------------------------------------------------
    def pages_needed(self, req: GenerateRequest) -> int:
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
        out = GenerateOutput(rid=req.rid, prompt_tokens=len(req.input_ids))
        r = Req(req=req, out=out)
        seed = req.sampling.seed if req.sampling.seed is not None else self.cfg.seed
        r.generator = torch.Generator().manual_seed(seed)
        self.waiting.append(r)
        self.counters["requests"] += 1
        self.counters["prompt_tokens"] += len(req.input_ids)
        return r

    def _alloc_pages(self, n: int) -> list[int] | None:
        pages = self.kv.alloc(n)
        if pages is None and self.radix is not None:
            self.radix.evict_kv(n - self.kv.free_pages)
            pages = self.kv.alloc(n)
        return pages

    def _alloc_slots(self, n: int) -> list[int] | None:
        slots = self.state.alloc(n)
        if slots is None and self.radix is not None:
            self.radix.evict_checkpoints(n - self.state.free_slots)
            slots = self.state.alloc(n)
        return slots

    def admit(self) -> list[Req]:
        """Move waiting requests into running while pools allow (FIFO; head-of-line waits)."""
        admitted = []
        while self.waiting and len(self.running) < self.cfg.max_running_requests:
            r = self.waiting[0]
            prompt = list(r.prompt)
            match = None
            if self.radix is not None:
                # at least one prompt token must run to produce the first output's logits
                match = self.radix.match_prefix(prompt, max_len=len(prompt) - 1)
                self.radix.lock(match.node)
            cached = match.cached_len if match else 0
            own = self.pages_needed(r.req) - cached // self.cfg.page_size
            pages = self._alloc_pages(own)
            slots = self._alloc_slots(self.slots_needed()) if pages is not None else None
            if pages is None or slots is None:
                if pages is not None:
                    self.kv.free(pages)
                if match:
                    self.radix.unlock(match.node)
                break
            self.waiting.popleft()
            r.pages = list(match.pages if match else ()) + pages
            r.own_pages_from = cached // self.cfg.page_size
            r.working_slot, r.track_slots = slots[0], slots[1:]
            self.runner.zero_states(slots)
            r.prefix_node = match.node if match else None
            if cached:
                self.runner.copy_state(match.checkpoint, r.working_slot)
            r.seq_len = cached
            r.last_track_seqlen = cached
            r.out.cached_tokens = cached
            self.counters["cached_tokens"] += cached
            self.running.append(r)
            admitted.append(r)
        return admitted

    # --- planning -----------------------------------------------------------
    def prefill_chunks(self) -> list[tuple[Req, int, int]]:
        """(req, start, end) chunks for this step, within the prefill token budget.

        With checkpoint tracking, chunks end at every multiple of the track interval
        so the working state there can be checkpointed.
        """
        budget = self.cfg.chunked_prefill_size
        chunks = []
        for r in self.running:
            if not r.in_prefill or budget <= 0:
                continue
            end = min(len(r.prompt), r.seq_len + budget)
            if self.tracking:
                end = min(end, (r.seq_len // self.interval + 1) * self.interval)
            chunks.append((r, r.seq_len, end))
            budget -= end - r.seq_len
        return chunks

    def decode_batch(self) -> list[Req]:
        return [r for r in self.running if not r.in_prefill and not r.out.finished and r.pending is not None]

    # --- progress -----------------------------------------------------------
    def on_tokens_committed(self, r: Req, new_len: int) -> bool:
        """Non-speculative progress (prefill chunk or decode): returns True if a checkpoint is due now."""
        r.seq_len = new_len
        return self.tracking and new_len % self.interval == 0 and new_len > r.last_track_seqlen

    def record_track(self, r: Req, boundary: int) -> int:
        """Bookkeeping of a checkpoint at `boundary`; returns the tracking slot it belongs in."""
        slot = r.next_track_slot()
        r.track_count += 1
        r.last_track_seqlen, r.last_track_slot = boundary, slot
        return slot

    def append_token(self, r: Req, token: int, logits: torch.Tensor) -> bool:
        """Add a generated token with its logprobs; returns True when the request is now finished."""
        out, sp = r.out, r.req.sampling
        out.output_ids.append(token)
        if r.req.return_logprob or r.req.top_logprobs_num:
            lp, top = logprob_info(logits, token, r.req.top_logprobs_num)
            out.output_logprobs.append(lp)
            out.output_top_logprobs.append(top)
        self.counters["generation_tokens"] += 1
        r.pending = token
        if len(out.output_ids) >= sp.min_new_tokens:  # vLLM's stop checker: no stop before min_tokens
            out.finish_reason = stop_reason(token, out.output_ids, sp)
        if out.finish_reason is None and len(out.output_ids) >= sp.max_new_tokens:
            out.finish_reason = {"type": "length", "length": len(out.output_ids)}
        if out.finish_reason is not None:
            out.finished = True
        return out.finished

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
        """Release finished and aborted running requests; returns them."""
        done = []
        for r in list(self.running):
            if r.aborted is not None and not r.out.finished:
                r.out.finished = True
                r.out.finish_reason = {"type": "abort", "message": r.aborted}
                self.counters["aborted"] += 1
            if r.out.finished:
                self._release(r, cache=r.aborted is None)
                self.running.remove(r)
                self.counters["finished"] += 1
                done.append(r)
        return done

    def _release(self, r: Req, cache: bool) -> None:
        ps = self.cfg.page_size
        keep_pages: set[int] = set()
        keep_slots: set[int] = set()
        if cache and self.radix is not None:
            length, slot = self._insertion(r)
            if length > r.out.cached_tokens and slot is not None:
                n = length // ps
                res = self.radix.insert(r.tokens()[:length], r.pages[:n], slot)
                keep_pages = set(r.pages[r.own_pages_from : n]) - set(res.dup_pages)
                if res.checkpoint_adopted:
                    keep_slots.add(slot)
        self.kv.free([p for p in r.pages[r.own_pages_from :] if p not in keep_pages])
        self.state.free([s for s in [r.working_slot, *r.track_slots] if s is not None and s not in keep_slots])
        if r.prefix_node is not None:
            self.radix.unlock(r.prefix_node)
        r.pages, r.track_slots, r.working_slot, r.prefix_node = [], [], None, None

    def _insertion(self, r: Req) -> tuple[int, int | None]:
        """(prefix length, state slot) to insert into the radix cache when r finishes."""
        if self.cfg.mamba_radix_cache_strategy == "no_buffer":
            return r.seq_len, r.working_slot
        if active(self.cfg, INSERT_WORKING_STATE):
            return r.last_track_seqlen, r.working_slot if r.last_track_slot is not None else None
        return r.last_track_seqlen, r.last_track_slot

    def flush(self) -> bool:
        """Empty the radix cache; refused (False) while requests are running or waiting."""
        if self.running or self.waiting:
            return False
        if self.radix is not None:
            self.radix.flush()
        return True
