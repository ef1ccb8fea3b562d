"""A sweep point's warmup: `--warmup N` requests sent in the point's shape before its gated requests.

Warmup requests are the first turns of the pool's sessions, taken in order (and again from the start when N
is larger): real prompts of the workload, so the server warms on what it will serve. They are recorded with
role "warmup" in their own journal (records/schema.py WARMUP_FILE) with no reference and no verdict; the
driver flushes the caches after them, so that the gated requests start from the same cold cache.
"""

from __future__ import annotations

import asyncio
import time

from harness.arrival import gaps
from harness.pools import Pool
from harness.recorded import RunSoFar
from harness.recorder import Recorder
from harness.sender import Sender
from harness.sweep import Point, PointCounts
from records.schema import warmup_key


class Warmup:
    """The warmup of every sweep point: `n` requests each (0: none)."""

    def __init__(self, n: int, seed: int, *, sender: Sender, recorder: Recorder, so_far: RunSoFar) -> None:
        self.n, self.seed = n, seed
        self.sender, self.recorder, self.so_far = sender, recorder, so_far

    async def run(self, pool: Pool, point: Point, sessions: tuple, counts: PointCounts) -> None:
        """Send the point's warmup requests (closed loop: `concurrency` in flight; open loop: at the point's
        rate and arrival) and record them; counts go to `counts.warmup` / `counts.warmup_failed`."""
        n = self.n
        sem = asyncio.Semaphore(point.concurrency or n)
        offsets = []
        if point.rate is not None:
            t = 0.0
            for gap in gaps(n, point.rate, point.arrival, self.seed + 1):  # + 1: not the gated schedule's gaps
                t += gap
                offsets.append(t)
        t0 = time.perf_counter()

        async def one(i: int) -> None:
            key = warmup_key(pool.name, point.label, i)
            if self.so_far.written(key):
                return
            if offsets:
                await asyncio.sleep(max(0.0, t0 + offsets[i] - time.perf_counter()))
            index = i % len(sessions)
            session = sessions[index]
            ids = list(session.turn_input(0, None, None))
            max_new = session.turns[0].max_new_tokens
            async with sem:
                t_start = time.time()
                sent = await self.sender.send(pool, index, pool.backend.payload(ids, max_new, stream=True), key)
            self.recorder.warmup(self.recorder.record(pool, point, session, 0, ids, max_new, key, t_start, sent))
            counts.warmup += 1
            counts.warmup_failed += sent.error is not None

        await asyncio.gather(*(one(i) for i in range(n)))
