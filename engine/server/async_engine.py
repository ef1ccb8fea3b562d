"""AsyncEngine: the engine loop on a background thread, with asyncio streaming for the server."""

from __future__ import annotations

import asyncio
import copy
import queue
import threading
import traceback
from collections.abc import AsyncIterator

import torch

from engine.config import EngineConfig
from engine.engine import Engine
from engine.io_struct import GenerateOutput, GenerateRequest


class EngineDeadError(RuntimeError):
    """The engine loop failed; every in-flight and later request gets this error."""


class AsyncEngine:
    """Thread-safe front of an Engine. Each request gets an asyncio queue of output snapshots."""

    def __init__(self, cfg: EngineConfig, engine: Engine | None = None):
        self.engine = engine or Engine(cfg)
        self.cfg = cfg
        self._inbox: queue.Queue = queue.Queue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self.health_error: str | None = None
        self._thread = threading.Thread(target=self._loop, name="engine-loop", daemon=True)
        self._thread.start()

    @property
    def healthy(self) -> bool:
        return self.health_error is None and self._thread.is_alive()

    @property
    def model_config(self):
        return self.engine.model_config

    # --- client side --------------------------------------------------------
    async def generate_stream(self, req: GenerateRequest) -> AsyncIterator[GenerateOutput]:
        """Yield snapshots of req's output as tokens arrive; the last one has finished=True.

        Raises ValueError for a request the engine cannot serve, EngineDeadError if the loop died.
        """
        if not self.healthy:
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
        try:
            while True:
                item = await q.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finished:
                    return
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
        if stop_ranks is not None:
            stop_ranks()

    # --- loop side ----------------------------------------------------------
    def _publish(self, out: GenerateOutput) -> None:
        with self._lock:
            target = self._streams.get(out.rid)
            if target is not None and out.finished:
                self._streams.pop(out.rid)
        if target is not None:
            loop, q = target
            loop.call_soon_threadsafe(q.put_nowait, copy.deepcopy(out))

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
        try:
            while not self._stop:
                self._drain_inbox()
                if not self.engine.has_work:
                    self._wake.wait(0.05)
                    self._wake.clear()
                    continue
                for out in self.engine.step():
                    self._publish(out)
        except Exception as e:  # noqa: BLE001 - the loop must report, not vanish
            traceback.print_exc()
            self.fail(f"engine loop failed: {e}")

    def fail(self, message: str) -> None:
        """Mark the engine dead (e.g. a tensor-parallel rank died): every in-flight request errors now."""
        if self.health_error is None:
            self.health_error = message
        self._stop = True
        with self._lock:
            streams = list(self._streams.items())
            self._streams.clear()
        for _rid, (loop, q) in streams:
            loop.call_soon_threadsafe(q.put_nowait, EngineDeadError(self.health_error))
