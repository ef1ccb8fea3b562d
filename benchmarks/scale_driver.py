"""benchmarks/scale.py's live parts: the real Driver answered instantly by a backend that replays synthesized
answers (its bookkeeping is what is measured), and the SSE reader fed one large event."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from types import SimpleNamespace

from harness.backends import Backend
from harness.backends.sse import sse_data
from harness.driver import Driver
from harness.pools import Pool, Replica
from harness.progress import Progress
from harness.targets import run_config
from harness.targets.builtin import candidate_engine, reference_engine
from records.jsonl import RecordFiles
from records.rundir import input_hash


class ReplayBackend(Backend):
    """Answers every request at once with the synthesized session's answer for it (no HTTP)."""

    name = "replay"

    def __init__(self, sessions: list) -> None:
        super().__init__()
        self.by_id = {s.session_id: s for s in sessions}
        self.pending: dict[str, tuple] = {}  # input hash -> (session, turn): a reference not yet answered

    async def server_info(self, http, url):
        return {}

    async def probe(self, http, url, role, generate=True):
        return {}

    def payload(self, input_ids, max_new_tokens, stream):
        return {"input_ids": input_ids, "max_new_tokens": max_new_tokens}

    async def generate(self, http, url, payload, timeout, incremental=False):
        key = payload["rid"].split(":", 1)[1]
        ids = payload["input_ids"]
        if key.startswith("ref/"):
            session, turn = self.pending.pop(key[4:])
            return session.answer(turn, "reference", len(ids))
        _, session_id, turn = key.rsplit("/", 2)
        session = self.by_id[session_id]
        return session.answer(int(turn), "candidate", len(ids))

    def register(self, session, turn: int, ids: list[int]) -> None:
        self.pending.setdefault(input_hash(ids), (session, turn))

    async def flush(self, http, url, wait=60.0):
        return None

    async def counters(self, http, url):
        return {}


class _Registering:
    """A session as the driver sees it, telling the backend which turn each input belongs to."""

    def __init__(self, session, backend: ReplayBackend) -> None:
        self._s, self._b = session, backend

    def __getattr__(self, name):
        return getattr(self._s, name)

    def turn_input(self, turn, prev_input, prev_output):
        ids = self._s.turn_input(turn, prev_input, prev_output)
        self._b.register(self._s, turn, ids)
        return ids


async def run_driver(sessions: list, run_dir: Path, rss, concurrency: int = 8) -> int:
    """Every session through harness.driver.Driver at one sweep point, records written to run_dir; returns
    `rss()` when the driver has finished, before the records are closed (a close may compact them)."""
    pool_name = sessions[0].t.pool
    interval = int(pool_name[1:]) if pool_name[1:].isdigit() else 128
    cfg = run_config(intervals=(interval,))
    backend = ReplayBackend(sessions)
    cand = Pool(pool_name, "candidate", candidate_engine(cfg, interval), [Replica(f"{pool_name}-r0", "replay")],
                True, 5.0, backend=backend)
    ref = Pool("reference", "reference", reference_engine(cfg), [Replica("reference-r0", "replay")], True, 5.0,
               backend=backend)
    files = RecordFiles(run_dir, set())
    progress = Progress(0, 0, enabled=False)
    progress.write = lambda line: None
    driver = Driver(run_id="scale", concurrency=(concurrency,), candidates=[cand], reference=ref, files=files,
                    http=None, progress=progress, reference_concurrency=concurrency)
    await driver.run({pool_name: tuple(_Registering(s, backend) for s in sessions)})
    backend.by_id.clear()  # the benchmark's own index, not the driver's
    done = rss()
    files.close()
    return done


class _Content:
    def __init__(self, chunks):
        self.chunks = chunks

    async def iter_any(self):
        for c in self.chunks:
            yield c


def sse_seconds(size: int, chunk: int) -> tuple[float, int]:
    """Seconds for harness.backends.sse.sse_data to read one `size`-byte data event arriving `chunk` bytes
    at a time (and how many events it yielded)."""
    body = json.dumps({"text": "x" * (size - 20)}).encode()
    stream = b"data: " + body + b"\n\n"
    chunks = [stream[i:i + chunk] for i in range(0, len(stream), chunk)]

    async def read() -> int:
        n = 0
        async for _, payload in sse_data(SimpleNamespace(content=_Content(chunks))):
            n += 1
            assert payload == body
        return n

    t0 = time.perf_counter()
    n = asyncio.run(read())
    return time.perf_counter() - t0, n
