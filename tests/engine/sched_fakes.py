"""A fake runner and an engine-step driver for the scheduler's unit tests (no model, real pools).

`step` plays the Engine's part (engine/engine.py `step`, overlap off unless a
test turns it on) with the real Executor over a runner whose forwards return
scripted tokens instead of a model's, so the scheduler's bookkeeping can be
checked exactly: which pages and slots a request gets, where checkpoints are
taken, what the radix tree keeps when it finishes, and what goes back.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from engine.cache.kv_pool import KVPool
from engine.cache.state_pool import StatePool
from engine.config import EngineConfig
from engine.executor import Executor
from engine.io_struct import GenerateRequest, SamplingParams
from engine.scheduler import Scheduler
from protocol.tokenizer import VOCAB_SIZE

PS = 4
A = list(range(1, 201))  # prompt tokens (200 distinct ids)
LOGITS = torch.zeros(VOCAB_SIZE)


def one_hot(token: int) -> torch.Tensor:
    logits = torch.zeros(VOCAB_SIZE)
    logits[token] = 1.0
    return logits


class FakeRunner:
    """ModelRunner's methods the scheduler and executor call, recorded; the pools are real.

    The forwards return logits that make greedy sampling pick `next_token[working slot]`
    (0 when unscripted: an intermediate prefill chunk, whose logits nobody samples).
    """

    def __init__(self, num_pages: int = 16, num_slots: int = 8, page_size: int = PS):
        kv = KVPool(num_layers=1, num_pages=num_pages, page_size=page_size, num_kv_heads=1, head_dim=2)
        state = StatePool(num_layers=1, num_slots=num_slots, num_v_heads=1, head_k_dim=2, head_v_dim=2, conv_dim=2,
                          conv_kernel=2)
        self.caches = SimpleNamespace(kv=kv, state=state)
        self.calls: list[tuple] = []
        self.next_token: dict[int, int | torch.Tensor] = {}  # working slot -> a token, or the logits to return
        self.batches: list = []  # every ScheduleBatch run, for tests of the step plan

    def extend(self, tokens, start, pages, slot, track_slot=-1, track_offset=-1) -> torch.Tensor:
        if track_offset >= 0:  # a prefill checkpoint: the state `track_offset` tokens in goes to track_slot
            self.calls.append(("track", start + track_offset, track_slot))
        return self.logits(slot)

    def decode(self, tokens, starts, pages, slots) -> torch.Tensor:
        return torch.stack([self.logits(s) for s in slots])

    def logits(self, slot: int) -> torch.Tensor:
        want = self.next_token.get(slot, 0)
        return want if isinstance(want, torch.Tensor) else one_hot(want)

    def copy_state(self, src: int, dst: int) -> None:
        self.calls.append(("copy", src, dst))

    def zero_states(self, slots: list[int]) -> None:
        self.calls.append(("zero", list(slots)))


def config(**kw) -> EngineConfig:
    base = dict(model_path="random", model_preset="tiny", page_size=PS, mamba_track_interval=8,
                chunked_prefill_size=64, max_running_requests=4, disable_overlap_schedule=True)
    return EngineConfig(**{**base, **kw})


def make(num_pages: int = 16, num_slots: int = 8, max_context: int = 64, **kw) -> tuple[Scheduler, FakeRunner]:
    cfg = config(**kw)
    runner = FakeRunner(num_pages, num_slots, cfg.page_size)
    return Scheduler(cfg, runner, max_context), runner


def gen(rid: str, prompt, max_new: int = 4, **sampling) -> GenerateRequest:
    return GenerateRequest(rid=rid, input_ids=tuple(prompt),
                           sampling=SamplingParams(max_new_tokens=max_new, **{"temperature": 0.0, **sampling}))


def step(sched: Scheduler, script: dict[str, list[int]]) -> list:
    """One engine step with scripted tokens (Engine.step: schedule, run, process, reap); the requests it ended."""
    before = list(sched.running) + list(sched.waiting)
    batch = sched.schedule()
    runner = sched.runner
    runner.next_token = {}
    for r in [c.req for c in batch.prefill if c.last] + list(batch.decode):
        if script.get(r.rid):
            runner.next_token[r.working_slot] = script[r.rid].pop(0)
    runner.batches.append(batch)
    if batch:
        sched.process(batch, Executor(sched.cfg, runner).run(batch))
    sched.reap()
    return [r for r in before if r.out.finished and r not in sched.running and r not in sched.waiting]


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

