"""AsyncEngine: the engine loop on a background thread, with asyncio streaming for the server.

The loop publishes what each step *added* to a request (an `OutputDelta` of
immutable tuples), never a copy of the whole output, so a long request costs
O(new tokens) per step. Each consumer rebuilds its own cumulative
`GenerateOutput` from the deltas on the event loop's thread.

Liveness (engine/server/liveness.py): the loop beats a heartbeat every iteration;
`healthy` is false once it failed or went silent for `heartbeat_timeout`
seconds, and a watchdog fails it after `watchdog_timeout` seconds of silence.
`on_death` callbacks run (on the thread that failed it) when it dies, so the
server can exit and let its supervisor restart it.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import traceback
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import torch

from engine.config import EngineConfig
from engine.engine import Engine
from engine.io_struct import GenerateOutput, GenerateRequest
from engine.server.liveness import Heartbeat, LoopFault, watch


class EngineDeadError(RuntimeError):
    """The engine loop failed; every in-flight and later request gets this error."""


@dataclass(frozen=True)
class OutputDelta:
    """What the engine added to one request's output since it last published it."""

    output_ids: tuple[int, ...]
    output_logprobs: tuple[float, ...]
    output_top_logprobs: tuple  # per new token: [(logprob, token_id), ...] best first (never mutated later)
    spec_trace: tuple
    cached_tokens: int
    spec_verify_ct: int
    finished: bool
    finish_reason: dict | None
    # the prompt's log-probs (a request scoring its prompt), once: with the delta that ends the prefill
    input_logprobs: tuple | None = None
    input_top_logprobs: tuple | None = None
    injected_fault_hit: bool | None = None  # GenerateOutput.injected_fault_hit (cumulative)

    def apply(self, out: GenerateOutput) -> None:
        """Extend the consumer's cumulative `out` with this delta."""
        if self.input_logprobs is not None:
            out.input_logprobs, out.input_top_logprobs = list(self.input_logprobs), list(self.input_top_logprobs)
        out.output_ids.extend(self.output_ids)
        out.output_logprobs.extend(self.output_logprobs)
        out.output_top_logprobs.extend(self.output_top_logprobs)
        out.spec_trace.extend(self.spec_trace)
        out.cached_tokens, out.spec_verify_ct = self.cached_tokens, self.spec_verify_ct
        out.finished, out.finish_reason = self.finished, self.finish_reason
        out.injected_fault_hit = self.injected_fault_hit


class AsyncEngine:
    """Thread-safe front of an Engine. Each request gets an asyncio queue of output deltas."""

    def __init__(self, cfg: EngineConfig, engine: Engine | None = None, heartbeat_timeout: float = 5.0,
                 watchdog_timeout: float = 60.0, loop_fault: LoopFault | None = None):
        self.engine = engine or Engine(cfg)
        self.cfg = cfg
        self.heartbeat_timeout = heartbeat_timeout
        self._inbox: queue.Queue = queue.Queue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._sent: dict[str, tuple[int, int, int, int]] = {}  # loop thread only: lengths already published
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._fault = loop_fault
        self._death_callbacks: list[Callable[[str], None]] = []
        self.health_error: str | None = None
        self.heartbeat = Heartbeat()
        by_token = getattr(getattr(self.engine, "runner", None), "token_by_token", None)
        if by_token is not None:  # deterministic mode: a step is a forward per token, each a sign of life
            by_token.progress = self.heartbeat.beat
        self._thread = threading.Thread(target=self._loop, name="engine-loop", daemon=True)
        self._thread.start()
        watch(lambda: self._stop, self.heartbeat.silent_for, watchdog_timeout,
              lambda quiet: self.fail(f"engine loop stalled: no heartbeat for {quiet:.1f}s (--watchdog-timeout "
                                      f"{watchdog_timeout:g})"))

    @property
    def healthy(self) -> bool:
        return self.health_problem() is None

    def health_problem(self) -> str | None:
        """Why the engine cannot serve now (dead, or its loop silent too long), or None."""
        if self.health_error is not None:
            return self.health_error
        if not self._thread.is_alive():
            return "engine loop is not running"
        quiet = self.heartbeat.silent_for()
        if quiet > self.heartbeat_timeout:
            return (f"engine loop stalled: no heartbeat for {quiet:.1f}s "
                    f"(--heartbeat-timeout {self.heartbeat_timeout:g})")
        return None

    def on_death(self, callback: Callable[[str], None]) -> None:
        """Call `callback(message)` once the engine dies (at once if it already has)."""
        with self._lock:
            dead = self.health_error
            if dead is None:
                self._death_callbacks.append(callback)
        if dead is not None:
            callback(dead)

    @property
    def model_config(self):
        return self.engine.model_config

    # --- client side --------------------------------------------------------
    async def generate_stream(self, req: GenerateRequest) -> AsyncIterator[GenerateOutput]:
        """Yield req's output as tokens arrive: one GenerateOutput, extended in place between yields (read it
        before asking for the next); the last yield has finished=True.

        Raises ValueError for a request the engine cannot serve, EngineDeadError if the loop died.
        """
        if self.health_error is not None or not self._thread.is_alive():
            raise EngineDeadError(self.health_error or "engine loop is not running")
        self.engine.validate(req)
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        with self._lock:
            if req.rid in self._streams:
                raise ValueError(f"rid: a request with id {req.rid!r} is already running")
            self._streams[req.rid] = (loop, q)
        self._inbox.put(("submit", req))
        self._wake.set()
        out = GenerateOutput(rid=req.rid, prompt_tokens=len(req.input_ids))
        error: BaseException | None = None
        try:
            while not out.finished:
                item = error or await q.get()
                if isinstance(item, BaseException):
                    raise item
                item.apply(out)
                # apply the deltas already queued too (one yield for all); an error among them is raised on the
                # next call, once what was produced before it has been handed out
                while not out.finished and not q.empty():
                    item = q.get_nowait()
                    if isinstance(item, BaseException):
                        error = item
                        break
                    item.apply(out)
                yield out
        finally:
            with self._lock:
                still_open = self._streams.pop(req.rid, None) is not None
            if still_open:  # consumer left early (client disconnected): abort it
                self.abort(req.rid)

    async def generate(self, req: GenerateRequest) -> GenerateOutput:
        final = None
        async for out in self.generate_stream(req):
            final = out
        return final

    def abort(self, rid: str) -> None:
        self._inbox.put(("abort", rid))
        self._wake.set()

    def call(self, fn, timeout: float = 30.0):
        """Run fn(engine) on the loop thread (so it never races a step) and return its result."""
        done = threading.Event()
        box: dict = {}
        self._inbox.put(("call", (fn, box, done)))
        self._wake.set()
        if not done.wait(timeout):
            raise TimeoutError("engine loop did not answer")
        if "error" in box:
            raise box["error"]
        return box["value"]

    def flush_cache(self) -> bool:
        return self.call(lambda e: e.flush_cache())

    def stats(self) -> dict:
        return self.call(lambda e: e.stats())

    def server_info(self) -> dict:
        return self.call(lambda e: e.server_info())

    def num_active(self) -> int:
        with self._lock:
            return len(self._streams)

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout)
        stop_ranks = getattr(self.engine.runner, "shutdown", None)  # tensor-parallel ranks
        if stop_ranks is not None and not self._thread.is_alive():  # never race a loop stuck in a collective
            stop_ranks()

    # --- loop side ----------------------------------------------------------
    def _publish(self, out: GenerateOutput) -> None:
        n_ids, n_lp, n_top, n_tr = self._sent.get(out.rid, (0, 0, 0, 0))
        if out.finished:
            self._sent.pop(out.rid, None)
        else:
            self._sent[out.rid] = (len(out.output_ids), len(out.output_logprobs), len(out.output_top_logprobs),
                                   len(out.spec_trace))
        with self._lock:
            target = self._streams.get(out.rid)
            if target is not None and out.finished:
                self._streams.pop(out.rid)
        if target is None:
            return
        prefilled = n_ids == 0 and (out.output_ids or out.finished)  # the prompt's log-probs are all in
        delta = OutputDelta(tuple(out.output_ids[n_ids:]), tuple(out.output_logprobs[n_lp:]),
                            tuple(out.output_top_logprobs[n_top:]), tuple(out.spec_trace[n_tr:]),
                            out.cached_tokens, out.spec_verify_ct, out.finished, out.finish_reason,
                            tuple(out.input_logprobs) if prefilled else None,
                            tuple(out.input_top_logprobs) if prefilled else None, out.injected_fault_hit)
        loop, q = target
        loop.call_soon_threadsafe(q.put_nowait, delta)

    def _drain_inbox(self) -> None:
        while True:
            try:
                kind, arg = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "submit":
                try:
                    self.engine.submit(arg)
                except Exception as e:  # noqa: BLE001 - one bad request must not stop the loop
                    self._fail(arg.rid, e if isinstance(e, ValueError) else EngineDeadError(repr(e)))
            elif kind == "abort":
                self.engine.abort(arg)
            elif kind == "call":
                fn, box, done = arg
                try:
                    box["value"] = fn(self.engine)
                except Exception as e:  # noqa: BLE001 - handed back to the caller
                    box["error"] = e
                done.set()

    def _fail(self, rid: str, err: BaseException) -> None:
        with self._lock:
            target = self._streams.pop(rid, None)
        if target is not None:
            loop, q = target
            loop.call_soon_threadsafe(q.put_nowait, err)

    def _loop(self) -> None:
        torch.set_num_threads(max(1, torch.get_num_threads()))
        steps = 0
        try:
            while not self._stop:
                self.heartbeat.beat()
                self._drain_inbox()
                if not self.engine.has_work:
                    self._wake.wait(0.05)
                    self._wake.clear()
                    continue
                if self._fault is not None:
                    self._fault.check(steps)
                for out in self.engine.step():
                    self._publish(out)
                steps += 1
        except Exception as e:  # noqa: BLE001 - the loop must report, not vanish
            traceback.print_exc()
            self.fail(f"engine loop failed: {type(e).__name__}: {e}")

    def fail(self, message: str) -> None:
        """Mark the engine dead (the loop raised or stalled, a tensor-parallel rank died): every in-flight
        request errors now, and the `on_death` callbacks run."""
        with self._lock:
            if self.health_error is not None:
                return
            self.health_error = message
            self._stop = True
            streams = list(self._streams.items())
            self._streams.clear()
            callbacks, self._death_callbacks = self._death_callbacks, []
        for _rid, (loop, q) in streams:
            loop.call_soon_threadsafe(q.put_nowait, EngineDeadError(message))
        for cb in callbacks:
            try:
                cb(message)
            except Exception:  # noqa: BLE001 - e.g. the server's event loop is already closed
                traceback.print_exc()
