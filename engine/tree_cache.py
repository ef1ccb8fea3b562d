"""TreeCache: the request-level side of the radix cache, as SGLang's MambaRadixCache has it.

`RadixCache` (engine/cache/radix.py) is the tree; this owns what a request does
with it, with SGLang's names and orderings:

* `match` at admission: the deepest checkpoint, its KV pages, and the branching
  point (`_match_prefix_helper` / `_match_post_processor`);
* `cache_unfinished_req` after every prefill extend that does not finish the
  request: the tracked prefix enters the tree, the ping-pong slot holding its
  checkpoint is *donated* to the tree and replaced by a fresh one, the request's
  page table switches to the tree's pages and its lock moves down, so concurrent
  requests sharing the prefix hit it while this one is still running;
* `cache_finished_req` when it ends: the prefix up to the last checkpoint not yet
  in the tree is inserted, everything else freed.

Allocation evicts from the tree when a pool runs short. No tensor math: the one
state copy (the no_buffer strategy's snapshot) goes through the runner.
"""

from __future__ import annotations

from engine.cache.radix import InsertResult, MatchResult, RadixCache
from engine.config import EngineConfig
from engine.faults import INSERT_WORKING_STATE, SPLIT_INHERITS_CHECKPOINT, active
from engine.io_struct import GenerateRequest
from engine.req import Req


class TreeCache:
    def __init__(self, cfg: EngineConfig, runner):
        self.cfg, self.runner = cfg, runner
        self.kv, self.state = runner.caches.kv, runner.caches.state
        self.page_size = cfg.page_size
        self.radix = RadixCache(self.kv, self.state, cfg.page_size, cfg.inject_fault) if cfg.radix_cache else None
        self.tracking = cfg.tracking

    # --- allocation ---------------------------------------------------------
    def alloc_pages(self, n: int) -> list[int] | None:
        """n KV pages, evicting least-recently-used tree leaves if needed; None if they cannot be had."""
        pages = self.kv.alloc(n)
        if pages is None and self.radix is not None:
            self.radix.evict_kv(n - self.kv.free_pages)
            pages = self.kv.alloc(n)
        return pages

    def alloc_slots(self, n: int) -> list[int] | None:
        """n state slots, evicting unlocked checkpoints if needed; None if they cannot be had."""
        slots = self.state.alloc(n)
        if slots is None and self.radix is not None:
            self.radix.evict_checkpoints(n - self.state.free_slots)
            slots = self.state.alloc(n)
        return slots

    # --- admission ----------------------------------------------------------
    def match(self, prompt: list[int], max_len: int | None = None) -> MatchResult | None:
        """The prefix to resume from, not deeper than `max_len` (default: all but the last prompt token, whose
        logits start the output; a request scoring its prompt caps it lower, `max_prefix_len`)."""
        if self.radix is None:
            return None
        return self.radix.match_prefix(prompt, max_len=len(prompt) - 1 if max_len is None else max_len)

    def lock(self, r: Req, node) -> None:
        """r holds `node` (and its path) against eviction until released or moved."""
        self.radix.lock(node)
        r.prefix_node = node

    # --- insertion ------------------------------------------------------------
    def cache_unfinished_req(self, r: Req) -> None:
        """Insert r's last checkpoint (if one was taken since the last insert) while r keeps running."""
        if self.radix is None:
            return
        if self.tracking:
            length = r.last_track_seqlen
            if length is None:
                return
            donated = self.alloc_slots(1)
            if donated is None:  # no slot to replace the donated one: keep the checkpoint private
                return
            # donate the slot holding the checkpoint; the fresh one takes its place in the ping-pong pair
            keep_idx = 1 - r.next_track_idx
            donated, r.track_slots[keep_idx] = r.track_slots[keep_idx], donated[0]
        else:  # no_buffer: snapshot the working state at the prefilled length
            length = r.seq_len // self.page_size * self.page_size
            slot = self.alloc_slots(1)
            if slot is None or length == 0:
                self.state.free(slot or [])
                return
            donated = slot[0]
            self.runner.copy_state(r.working_slot, donated)
        self._insert_running(r, length, donated)
        r.last_track_seqlen = None

    def _insert_running(self, r: Req, length: int, checkpoint: int) -> None:
        """Insert r's first `length` tokens, then point r's page table and lock at the tree's copy."""
        n = length // self.page_size
        res = self.radix.insert(r.tokens()[:length], r.pages[:n], checkpoint)
        if not res.checkpoint_adopted:
            self.state.free([checkpoint])
        self._inherit_split_checkpoints(res)
        self.kv.free(list(res.dup_pages))
        r.pages[:n] = list(res.pages)
        old = r.prefix_node
        self.lock(r, res.node)
        if old is not None:
            self.radix.unlock(old)
        r.own_pages_from = max(r.own_pages_from, n)

    def cache_finished_req(self, r: Req, cache: bool) -> None:
        """Release r: insert its last checkpoint (if `cache`), free what the tree did not take, unlock."""
        keep_pages: set[int] = set()
        keep_slots: set[int] = set()
        if cache and self.radix is not None:
            length, slot = self._finished_insertion(r)
            if length and slot is not None:
                n = length // self.page_size
                res = self.radix.insert(r.tokens()[:length], r.pages[:n], slot)
                keep_pages = set(r.pages[r.own_pages_from : n]) - set(res.dup_pages)
                if res.checkpoint_adopted:
                    keep_slots.add(slot)
                self._inherit_split_checkpoints(res)
        self.kv.free([p for p in r.pages[r.own_pages_from :] if p not in keep_pages])
        self.state.free([s for s in [r.working_slot, *r.track_slots] if s is not None and s not in keep_slots])
        if r.prefix_node is not None:
            self.radix.unlock(r.prefix_node)
        r.pages, r.track_slots, r.working_slot, r.prefix_node = [], [], None, None

    def _inherit_split_checkpoints(self, res: InsertResult) -> None:
        """The split-inherits-checkpoint fault: nodes this insertion split off and left without a checkpoint
        get a copy of their lower part's (a state for a longer prefix). Off: split nodes stay without one."""
        if not active(self.cfg, SPLIT_INHERITS_CHECKPOINT):
            return
        for upper, lower in res.splits:
            if upper.checkpoint is not None or lower.checkpoint is None:
                continue  # the insertion ended there and adopted its own, or there is nothing to copy
            slot = self.alloc_slots(1)
            if slot is None or lower.checkpoint is None:  # allocating may have evicted the lower checkpoint
                self.state.free(slot or [])
                continue
            self.runner.copy_state(lower.checkpoint, slot[0])
            self.state.tainted.add(slot[0])  # a longer prefix's state at the split node's depth
            upper.checkpoint = slot[0]

    def _finished_insertion(self, r: Req) -> tuple[int, int | None]:
        """(prefix length, state slot) that enter the tree when r finishes."""
        if not self.tracking:  # no_buffer: the working state at the committed length
            return r.seq_len // self.page_size * self.page_size, r.working_slot
        if r.last_track_seqlen is None:
            return 0, None
        if active(self.cfg, INSERT_WORKING_STATE):
            if r.seq_len != r.last_track_seqlen:
                self.state.tainted.add(r.working_slot)  # the state of r.seq_len tokens, stored for fewer
            return r.last_track_seqlen, r.working_slot
        return r.last_track_seqlen, r.last_track_slot

    def flush(self) -> None:
        if self.radix is not None:
            self.radix.flush()


def max_prefix_len(req: GenerateRequest) -> int:
    """SGLang's `_compute_max_prefix_len`: at least one prompt token is left to run; a request that scores its
    prompt from `logprob_start_len` matches no deeper than that, so every position it asks about is computed."""
    limit = len(req.input_ids) - 1
    if req.scores_prompt:
        limit = min(limit, req.logprob_start_len)
    return max(limit, 0)
