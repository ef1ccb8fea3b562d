"""A sweep point's warmup: `--warmup N` requests sent in the point's shape before its gated requests.

Warmup requests are the first turns of the pool's sessions, taken in order (and again from the start when N
is larger): real prompts of the workload, so the server warms on what it will serve. They are recorded with
role "warmup" in their own journal (records/schema.py WARMUP_FILE) with no reference and no verdict; the
driver flushes the caches after them, so that the gated requests start from the same cold cache.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from harness.arrival import gaps
from harness.driver_point import Point, PointCounts
from records.reader import RunReader
from records.schema import POINTS_FILE, WARMUP_FILE, warmup_key


def recorded_keys(run_dir: Path) -> set[str]:
    """The keys of the point and warmup records already in `run_dir` (what a resume must not write again)."""
    reader = RunReader(run_dir)
    stems = {Path(POINTS_FILE).stem, Path(WARMUP_FILE).stem} & set(reader.stems())
    return {str(rec.get("key")) for stem in sorted(stems) for rec in reader.records(stem)}


async def run_warmup(driver, pool, point: Point, sessions: tuple, counts: PointCounts) -> None:
    """Send the point's warmup requests (closed loop: `concurrency` in flight; open loop: at the point's
    rate and arrival) and record them; counts go to `counts.warmup` / `counts.warmup_failed`."""
    n = driver.warmup
    sem = asyncio.Semaphore(point.concurrency or n)
    offsets = []
    if point.rate is not None:
        t = 0.0
        for gap in gaps(n, point.rate, point.arrival, driver.seed + 1):  # + 1: not the gated schedule's gaps
            t += gap
            offsets.append(t)
    t0 = time.perf_counter()

    async def one(i: int) -> None:
        key = warmup_key(pool.name, point.label, i)
        if key in driver.done_keys:
            return
        if offsets:
            await asyncio.sleep(max(0.0, t0 + offsets[i] - time.perf_counter()))
        index = i % len(sessions)
        session = sessions[index]
        ids = list(session.turn_input(0, None, None))
        max_new = session.turns[0].max_new_tokens
        async with sem:
            t_start = time.time()
            replica, gen, retries, error = await driver.send(
                pool, index, pool.backend.payload(ids, max_new, stream=True), key)
        rec = driver._record(pool, replica, point, session, 0, ids, max_new, gen, t_start, retries, error, key)
        rec["role"] = "warmup"
        driver.files.write(WARMUP_FILE, rec)
        counts.warmup += 1
        counts.warmup_failed += error is not None

    await asyncio.gather(*(one(i) for i in range(n)))
