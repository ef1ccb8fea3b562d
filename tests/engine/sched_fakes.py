"""A fake runner and an engine-step driver for the scheduler's unit tests (no model, real pools).

`step` plays the Engine's part (engine/engine.py `step` and `_decode`,
non-speculative) with scripted tokens instead of sampled ones, so the
scheduler's bookkeeping can be checked exactly: which pages and slots a request
gets, what the radix tree keeps when it finishes, and what goes back.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from engine.cache.kv_pool import KVPool
from engine.cache.state_pool import StatePool
from engine.config import EngineConfig
from engine.io_struct import GenerateRequest, SamplingParams
from engine.scheduler import Scheduler
from protocol.tokenizer import VOCAB_SIZE

PS = 4
A = list(range(1, 41))  # prompt tokens (40 distinct ids)
LOGITS = torch.zeros(VOCAB_SIZE)


class FakeRunner:
    """The two methods of ModelRunner the scheduler calls, recorded; the pools are real."""

    def __init__(self, num_pages: int = 16, num_slots: int = 8, page_size: int = PS):
        kv = KVPool(num_layers=1, num_pages=num_pages, page_size=page_size, num_kv_heads=1, head_dim=2)
        state = StatePool(num_layers=1, num_slots=num_slots, num_v_heads=1, head_k_dim=2, head_v_dim=2, conv_dim=2,
                          conv_kernel=2)
        self.caches = SimpleNamespace(kv=kv, state=state)
        self.calls: list[tuple] = []

    def copy_state(self, src: int, dst: int) -> None:
        self.calls.append(("copy", src, dst))

    def zero_states(self, slots: list[int]) -> None:
        self.calls.append(("zero", list(slots)))


def config(**kw) -> EngineConfig:
    base = dict(model_path="random", model_preset="tiny", page_size=PS, mamba_track_interval=8,
                chunked_prefill_size=64, max_running_requests=4)
    return EngineConfig(**{**base, **kw})


def make(num_pages: int = 16, num_slots: int = 8, max_context: int = 64, **kw) -> tuple[Scheduler, FakeRunner]:
    cfg = config(**kw)
    runner = FakeRunner(num_pages, num_slots, cfg.page_size)
    return Scheduler(cfg, runner, max_context), runner


def gen(rid: str, prompt, max_new: int = 4, **sampling) -> GenerateRequest:
    return GenerateRequest(rid=rid, input_ids=tuple(prompt), sampling=SamplingParams(max_new_tokens=max_new,
                                                                                     **sampling))


def step(sched: Scheduler, script: dict[str, list[int]]) -> list:
    """One engine step with scripted tokens (the Engine's order: admit, prefill chunks, decodes, reap)."""
    sched.admit()
    decodes = sched.decode_batch()
    for r, _, end in sched.prefill_chunks():
        if sched.on_tokens_committed(r, end):
            sched.runner.copy_state(r.working_slot, sched.record_track(r, end))
        if end == len(r.prompt):
            sched.append_token(r, script[r.rid].pop(0), LOGITS)
    for r in decodes:
        if sched.on_tokens_committed(r, r.seq_len + 1):
            sched.runner.copy_state(r.working_slot, sched.record_track(r, r.seq_len))
        sched.append_token(r, script[r.rid].pop(0), LOGITS)
    return sched.reap()


def run(sched: Scheduler, script: dict[str, list[int]]) -> list:
    done = []
    while sched.waiting or sched.running:
        done += step(sched, script)
    return done


def pools(sched: Scheduler) -> tuple[int, int]:
    return sched.kv.used_pages, sched.state.used_slots


def tree_size(sched: Scheduler) -> tuple[int, int]:
    """(pages, checkpoints) the radix tree holds: all the pools may hold once the scheduler is idle."""
    return sched.radix.cached_pages, sched.radix.cached_checkpoints


def prefill_tree(sched: Scheduler, tokens) -> tuple[list[int], int]:
    """Put `tokens` with a checkpoint into the radix tree, as a finished request would have."""
    pages, slot = sched.kv.alloc(len(tokens) // PS), sched.state.alloc(1)[0]
    sched.radix.insert(list(tokens), pages, slot)
    return pages, slot

