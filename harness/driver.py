"""The workload driver: sweeps over candidate pools, checked against the reference pool.

For each candidate pool and each sweep point (harness/sweep.py): flush the pool's caches, send the point's
warmup (harness/warmup.py; recorded apart, not gated) and flush again, then run the point's sessions
(harness/sessions.py): C sessions in flight at a concurrency point, or each request at its planned time at a
request-rate point. Every candidate input is also sent once to the reference pool (harness/references.py),
and a turn that restored a checkpoint is probed (harness/window.py). Records are written as answers arrive
(harness/recorder.py); a resumed run goes on from what earlier processes recorded (harness/recorded.py).
With `--drivers N` the sessions are sent by Ray actors and this driver keeps the rest (harness/driver_actors.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping

import aiohttp

from harness import cache_stats
from harness.pools import Pool
from harness.progress import Progress
from harness.recorded import RunSoFar
from harness.recorder import Recorder
from harness.references import References
from harness.sender import Sender
from harness.sessions import SessionLoop
from harness.sweep import Point, PointCounts, StopRule, point_record, sweep
from harness.warmup import Warmup
from harness.window import WindowProbe, without_probes
from records.jsonl import RecordFiles
from records.resume import Recorded, RefDone
from records.schema import POINTS_FILE, STATS_FILE, point_record_key


class Driver:
    """Runs every sweep point of a plan and writes the records (see module doc)."""

    def __init__(self, *, run_id: str, concurrency: tuple[int, ...], candidates: list[Pool], reference: Pool,
                 files: RecordFiles, http: aiohttp.ClientSession, progress: Progress,
                 existing: Mapping[str, dict | Recorded] | None = None,
                 existing_refs: Mapping[str, dict | RefDone] | None = None,
                 turn_io: Callable[[Iterable[str]], dict] | None = None,
                 request_timeout: float = 600.0, max_retries: int = 3, reference_concurrency: int = 8,
                 sequential_pools: bool = False, api_key: str | None = None,
                 tokenizers: dict[str, str] | None = None, decode: Callable[[list[int]], str] | None = None,
                 request_rate: tuple[float, ...] = (), arrival: str = "constant", seed: int = 0, warmup: int = 0,
                 duration: float | None = None, max_error_rate: float | None = None, windows: bool = True) -> None:
        # api_key: each pool's backend authenticates its own requests; the driver sends through them
        self.run_id, self.points = run_id, sweep(concurrency, request_rate, arrival)
        self.candidates, self.sequential_pools = candidates, sequential_pools
        self.files, self.http, self.progress = files, http, progress
        self.duration, self.max_error_rate = duration, max_error_rate
        # what earlier processes recorded, as summaries (records/resume.py: no record is held for the run)
        self.so_far = RunSoFar(existing, existing_refs, turn_io)
        self.sender = Sender(run_id=run_id, http=http, progress=progress, request_timeout=request_timeout,
                             max_retries=max_retries)
        self.recorder = Recorder(run_id=run_id, files=files, progress=progress, tokenizers=tokenizers or {},
                                 decode=decode)
        self.references = References(reference, sender=self.sender, recorder=self.recorder, progress=progress,
                                     concurrency=reference_concurrency, answered=self.so_far.references)
        self.windows = WindowProbe(self.sender, self.references, enabled=windows)
        self.warmup = Warmup(warmup, seed, sender=self.sender, recorder=self.recorder, so_far=self.so_far)
        self.sessions = SessionLoop(sender=self.sender, recorder=self.recorder, references=self.references,
                                    windows=self.windows, so_far=self.so_far, seed=seed)

    async def run(self, sessions: dict[str, tuple]) -> None:
        """Every sweep point of every pool; returns when all candidate and reference records are written."""
        owed = self.so_far.load(self.files.dir.parent, sessions, [p.label for p in self.points])
        for _ in range(self.so_far.mismatches()):
            self.progress.mismatch()
        for rec, session in owed:  # an earlier process recorded the candidate and stopped before its reference
            ids = self.so_far.io[rec.key][0]
            self.references.compare(rec, self.references.answer(ids, rec.input_hash, rec.max_new_tokens, session,
                                                                rec.turn))
        # a reference pool that cannot be served stops everything at once: nothing left could be judged
        fatal = self.references.fatal
        work = asyncio.ensure_future(self._pools(sessions))
        await asyncio.wait({work, fatal}, return_when=asyncio.FIRST_COMPLETED)
        if fatal.done():
            work.cancel()
            self.windows.cancel()
            await asyncio.gather(work, return_exceptions=True)
            raise fatal.exception()
        await work

    async def close(self) -> None:
        """Nothing to stop: everything ran in this process (harness/driver_actors.py stops its actors here)."""

    async def _pools(self, sessions: dict[str, tuple]) -> None:
        async def run_pool(pool: Pool) -> None:
            for point in self.points:
                await self.sweep_point(pool, point, sessions[pool.name])

        if self.sequential_pools:
            for pool in self.candidates:
                await run_pool(pool)
        else:
            await asyncio.gather(*(run_pool(p) for p in self.candidates))
        await self.references.wait()

    async def sweep_point(self, pool: Pool, point: Point, sessions: tuple) -> None:
        """Flush the pool's caches, send the warmup, run the point's unfinished sessions in its shape, then write
        the point's cache stats and its record."""
        todo = self.so_far.todo(pool.name, point.label, sessions)
        if not todo or self.so_far.written(point_record_key(pool.name, point.label)):
            return
        counts = PointCounts(planned=self.so_far.left(pool.name, point.label, todo))
        await pool.flush(self.http)
        resumed = self.so_far.started(pool.name, point.label)  # then the process that started it sent its warmup
        if self.warmup.n and not resumed:
            await self.warmup.run(pool, point, sessions, counts)
            await pool.flush(self.http)  # the gated requests start as cold as they would without a warmup
        before, wall0 = await cache_stats.snapshot(self.http, pool), time.time()
        t0 = time.perf_counter()
        stop = StopRule(self.duration, self.max_error_rate, counts)
        try:
            await self.sessions.run(pool, point, todo, stop, wall0)
        except BaseException:
            self.windows.cancel((pool.name, point.label))
            raise
        counts.wall_s, counts.stopped = time.perf_counter() - t0, stop.reason
        await self.windows.drain((pool.name, point.label))  # records still waiting for a reference probe
        await self._write_stats(pool, point, before, wall0, resumed)
        self.files.write(POINTS_FILE, point_record(
            run_id=self.run_id, pool=pool.name, point=point, counts=counts, t_start=wall0, t_end=time.time(),
            warmup=self.warmup.n, duration=self.duration, max_error_rate=self.max_error_rate))
        self.progress.point(pool.name, point, counts)

    async def _write_stats(self, pool: Pool, point: Point, before: dict, wall0: float, partial: bool) -> None:
        """The point's cache counters per replica (harness/cache_stats.py), less the restore-window probes' hits."""
        after = await cache_stats.snapshot(self.http, pool)
        for rec in cache_stats.stats_records(run_id=self.run_id, pool=pool.name, concurrency=point.concurrency,
                                             before=before, after=after, t_start=wall0, t_end=time.time(),
                                             partial=partial):
            rec.update(key=f"stats/{pool.name}-{point.label}/{rec['replica_id']}", request_rate=point.rate)
            without_probes(rec, self.windows.hits_of(pool.name, point.label, rec["replica_id"]))
            self.files.write(STATS_FILE, rec)
