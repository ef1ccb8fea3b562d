"""Engine: one replica's step loop (scheduler + runner + DFlash worker)."""

from __future__ import annotations

import copy
import math

from engine import kernels
from engine.config import EngineConfig
from engine.executor import Executor
from engine.io_struct import GenerateOutput, GenerateRequest
from engine.runner import ModelRunner
from engine.scheduler import Scheduler
from engine.tp.group import SINGLE, TPContext
from protocol.tokenizer import VOCAB_SIZE


def pool_slots(cfg: EngineConfig) -> int:
    """Linear-state pool size: working + tracking slots per running request, plus cached checkpoints."""
    return cfg.max_state_slots or cfg.max_running_requests * (3 if cfg.tracking else 1) + (
        4 * cfg.max_running_requests if cfg.radix_cache else 0)


def pool_pages(cfg: EngineConfig) -> int:
    return math.ceil(cfg.max_total_tokens / cfg.page_size)


class Engine:
    """Synchronous engine: `submit` requests, call `step` until idle (or use `generate`)."""

    def __init__(self, cfg: EngineConfig, tp: TPContext = SINGLE, runner=None):
        """`runner`: a prebuilt runner (a tensor-parallel proxy); else a single-rank ModelRunner."""
        cfg.validate()
        kernels.set_force_torch(cfg.force_torch_kernels)
        self.cfg = cfg
        num_pages = pool_pages(cfg)
        self.runner = runner or ModelRunner(cfg, num_pages, pool_slots(cfg), tp)
        self.model_config = self.runner.model_cfg
        self.max_context = self.model_config.max_position_embeddings
        self.sched = Scheduler(cfg, self.runner, self.max_context)
        self.executor = Executor(cfg, self.runner)
        self._unprocessed = None  # overlap scheduling: the last step's (batch, result), processed next step

    # --- requests -----------------------------------------------------------
    def validate(self, req: GenerateRequest) -> None:
        """Raise ValueError (naming the field) for a request this engine cannot serve."""
        bad = [t for t in req.input_ids if not 0 <= int(t) < VOCAB_SIZE]
        if bad:
            raise ValueError(f"input_ids: token id {bad[0]} is outside the vocabulary (0..{VOCAB_SIZE - 1})")
        self.sched.check_fits(req)

    def submit(self, req: GenerateRequest) -> None:
        self.validate(req)
        self.sched.add(req)

    def abort(self, rid: str, message: str = "aborted by client") -> bool:
        return self.sched.abort(rid, message)

    @property
    def has_work(self) -> bool:
        return bool(self.sched.waiting or self.sched.running or self._unprocessed)

    # --- the loop -----------------------------------------------------------
    def step(self) -> list[GenerateOutput]:
        """Plan and run one step (prefill chunks + one decode/verify batch) and process a step's result.

        With overlap scheduling (the default, as in SGLang) the result processed is the previous
        step's: this step was planned and run before it, from the requests' device view. With
        --disable-overlap-schedule it is this step's own. Returns the outputs that changed.
        """
        batch = self.sched.schedule()
        ran = (batch, self.executor.run(batch)) if batch else None
        if self.cfg.overlap_schedule:
            ran, self._unprocessed = self._unprocessed, ran
        touched = self.sched.process(*ran) if ran else {}
        for r in self.sched.reap():  # requests aborted while nothing of theirs was in flight
            touched[r.rid] = r.out
        return list(touched.values())

    def generate(self, reqs: list[GenerateRequest]) -> list[GenerateOutput]:
        """Run requests to completion (continuous batching among them); outputs in input order."""
        outs = {}
        for q in reqs:
            self.submit(q)
        while self.has_work:
            for o in self.step():
                if o.finished:
                    outs[o.rid] = copy.deepcopy(o)
        return [outs[q.rid] for q in reqs]

    # --- cache and stats ----------------------------------------------------
    def flush_cache(self) -> bool:
        return not self._unprocessed and self.sched.flush()

    def pool_usage(self) -> dict:
        kv, st = self.runner.caches.kv, self.runner.caches.state
        radix = self.sched.radix
        return {
            "kv_pages_used": kv.used_pages, "kv_pages_total": kv.num_pages,
            "state_slots_used": st.used_slots, "state_slots_total": st.num_slots,
            "radix_pages": radix.cached_pages if radix else 0,
            "radix_checkpoints": radix.cached_checkpoints if radix else 0,
        }

    def stats(self) -> dict:
        c = dict(self.sched.counters)
        radix = self.sched.radix
        c.update(self.pool_usage())
        c["running"] = len(self.sched.running)
        c["waiting"] = len(self.sched.waiting)
        c["kv_evicted_pages"] = radix.kv_evictions if radix else 0
        c["checkpoint_evictions"] = radix.checkpoint_evictions if radix else 0
        c["avg_accept_length"] = c["generation_tokens"] / c["verify_steps"] if c["verify_steps"] else 0.0
        return c

    def server_info(self) -> dict:
        info = self.cfg.to_dict()
        info.update(
            mamba_ssm_dtype=self.cfg.ssm_dtype,  # the resolved dtype (the setting's default follows --dtype)
            model_config=self.model_config.to_dict(), max_context_length=self.max_context,
            block_size=self.cfg.speculative_num_draft_tokens if self.cfg.speculative else None,
            avg_accept_length=self.stats()["avg_accept_length"],
        )
        return info
