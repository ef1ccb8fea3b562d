"""The workload driver: sweeps over candidate pools, checked against the reference pool.

For each candidate pool and each sweep point (harness/driver_point.py): flush the pool's caches, send the
point's warmup (recorded apart, not gated) and flush again, then run every session of the pool: with C
sessions (so at most C requests) in flight at a concurrency point, or each request at its planned time
(harness/arrival.py) at a request-rate point. All turns of a session go to one replica (its cache lives
there) in order, and turn n+1 is built from turn n's candidate output. Every candidate input is also sent
once to the reference pool; identical inputs share one reference request for the whole run (a resume sends
the ones an earlier process left unanswered). Records are written as answers arrive.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial

import aiohttp

from harness import cache_stats
from harness.arrival import schedule
from harness.driver_point import Point, PointCounts, StopRule, point_record, sweep
from harness.driver_ref import ReferenceMixin
from harness.driver_send import send
from harness.driver_warmup import recorded_keys, run_warmup
from harness.pools import Pool, Replica
from harness.progress import Progress
from harness.refstore import Recorded, RefDone, as_recorded, as_ref_done, continued, records_io
from harness.window import RefWindows, candidate_probe, wants_window, without_probes
from records.jsonl import RecordFiles
from records.rundir import candidate_file, input_hash
from records.schema import POINTS_FILE, STATS_FILE, Generation, build_record, point_key, point_record_key


class Driver(ReferenceMixin):
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
        self.run_id, self.points = run_id, sweep(concurrency, request_rate, arrival)
        self.windows, self.ref_windows = windows, RefWindows()  # restore-window probes (harness/window.py)
        self.probe_hits: dict[tuple[str, str, str], int] = {}  # (pool, point label, replica) -> probes' cached tokens
        self.seed, self.warmup, self.duration, self.max_error_rate = seed, warmup, duration, max_error_rate
        self.candidates, self.reference = candidates, reference
        self.files, self.http, self.progress = files, http, progress
        # what earlier processes recorded, as summaries (harness/refstore.py: no record is held for the run);
        # `turn_io` reads back the ids of the recorded turns a resumed session or a missing reference needs
        self.existing = {k: as_recorded(r) for k, r in (existing or {}).items()}
        self.existing_refs = {h: as_ref_done(r) for h, r in (existing_refs or {}).items()}
        self.turn_io = turn_io or records_io(existing or {})
        self.resumed_io: dict[str, tuple] = {}
        self.request_timeout, self.max_retries = request_timeout, max_retries
        self.reference_concurrency = reference_concurrency
        self.sequential_pools, self.api_key = sequential_pools, api_key
        self.tokenizers = tokenizers or {}
        self.decode = decode  # the target's tokenizer: the text of answers that come without it
        self.ref_futures: dict[str, asyncio.Future] = {}  # input hash -> its reference, while pending (or failed)
        self.refs_done: dict[str, RefDone] = {}  # input hash -> its answered reference's summary
        self.sent: dict[str, int] = {}  # pool -> candidate requests sent by this process
        self.failed: dict[str, int] = {}  # pool -> candidate records with an error
        self.served: dict[str, tuple[str, int]] = {}  # candidate key -> (replica id, incarnation) that answered
        self.counts: dict[tuple[str, str], PointCounts] = {}  # (pool, point label) -> this process's counts

    async def run(self, sessions: dict[str, tuple]) -> None:
        """Every sweep point of every pool; returns when all candidate and reference records are written."""
        loop = asyncio.get_running_loop()
        self.ref_sem = asyncio.Semaphore(self.reference_concurrency)
        self.refs_done.update(self.existing_refs)
        self.done_keys = recorded_keys(self.files.dir.parent)  # point and warmup records of earlier processes
        by_id = {(name, s.session_id): s for name, group in sessions.items() for s in group}
        unanswered = [r for r in self.existing.values() if not r.failed and (r.pool, r.session_id) in by_id
                      and str(r.input_hash) not in self.refs_done]
        need = {r.key for r in unanswered} | continued(self.existing, sessions, [p.label for p in self.points])
        self.resumed_io = self.turn_io(need) if need else {}
        for rec in self.existing.values():
            ref = self.existing_refs.get(str(rec.input_hash))
            if ref is not None and rec.differs(ref):
                self.progress.mismatch()
        for rec in unanswered:  # an earlier process recorded the candidate and stopped before its reference answered
            fut = self.reference_for(self.resumed_io[rec.key][0], rec.input_hash, rec.max_new_tokens,
                                     by_id[(rec.pool, rec.session_id)], rec.turn)
            fut.add_done_callback(partial(self._compare, rec))

        async def run_pool(pool: Pool) -> None:
            for point in self.points:
                await self.sweep_point(pool, point, sessions[pool.name])

        async def run_pools() -> None:
            if self.sequential_pools:
                for pool in self.candidates:
                    await run_pool(pool)
            else:
                await asyncio.gather(*(run_pool(p) for p in self.candidates))
            await asyncio.gather(*self.ref_futures.values())

        # a reference pool that cannot be served stops everything at once: nothing left could be judged
        self.fatal = loop.create_future()
        work = asyncio.ensure_future(run_pools())
        await asyncio.wait({work, self.fatal}, return_when=asyncio.FIRST_COMPLETED)
        if self.fatal.done():
            work.cancel()
            self.ref_windows.cancel()
            await asyncio.gather(work, return_exceptions=True)
            raise self.fatal.exception()
        await work

    async def sweep_point(self, pool: Pool, point: Point, sessions: tuple) -> None:
        """Flush the pool's caches, send the warmup, then run the point's unfinished sessions in its shape."""
        todo = [(i, s) for i, s in enumerate(sessions)
                if any(point_key(pool.name, point.label, s.session_id, n) not in self.existing
                       for n in range(len(s.turns)))]
        if not todo or point_record_key(pool.name, point.label) in self.done_keys:
            return
        counts = self.counts[(pool.name, point.label)] = PointCounts()
        counts.planned = sum(point_key(pool.name, point.label, s.session_id, n) not in self.existing
                             for _, s in todo for n in range(len(s.turns)))
        await pool.flush(self.http)
        # a resumed point's warmup was sent by the process that started it
        resumed = any(k.startswith(f"{pool.name}-{point.label}/") for k in self.existing)
        if self.warmup and not resumed:
            await run_warmup(self, pool, point, sessions, counts)
            await pool.flush(self.http)  # the gated requests start as cold as they would without a warmup
        before, wall0 = await cache_stats.snapshot(self.http, pool), time.time()
        t0 = time.perf_counter()
        stop = StopRule(self.duration, self.max_error_rate, counts)
        if point.rate is None:
            queue: Iterator = iter(todo)

            async def worker() -> None:
                for index, session in queue:
                    await self.run_session(pool, point, index, session, stop)

            runs = [worker() for _ in range(min(point.concurrency, len(todo)))]
        else:
            plan = schedule([len(s.turns) for _, s in todo], point.rate, point.arrival, self.seed)
            runs = [self.run_session(pool, point, index, session, stop, wall0,
                                     {n: plan[(k, n)] for n in range(len(session.turns))})
                    for k, (index, session) in enumerate(todo)]
        try:
            await asyncio.gather(*runs)
        except BaseException:
            self.ref_windows.cancel((pool.name, point.label))
            raise
        counts.wall_s, counts.stopped = time.perf_counter() - t0, stop.reason
        await self.ref_windows.drain((pool.name, point.label))
        after = await cache_stats.snapshot(self.http, pool)
        for rec in cache_stats.stats_records(run_id=self.run_id, pool=pool.name, concurrency=point.concurrency,
                                             before=before, after=after, t_start=wall0, t_end=time.time(),
                                             partial=resumed):
            rec.update(key=f"stats/{pool.name}-{point.label}/{rec['replica_id']}", request_rate=point.rate)
            without_probes(rec, self.probe_hits.pop((pool.name, point.label, rec["replica_id"]), 0))
            self.files.write(STATS_FILE, rec)
        self.files.write(POINTS_FILE, point_record(
            run_id=self.run_id, pool=pool.name, point=point, counts=counts, t_start=wall0, t_end=time.time(),
            warmup=self.warmup, duration=self.duration, max_error_rate=self.max_error_rate))
        self.progress.point(pool.name, point, counts)

    async def run_session(self, pool: Pool, point: Point, index: int, session, stop: StopRule,
                          wall0: float = 0.0, planned: dict[int, float] | None = None) -> None:
        """All turns of one session, in order, on the session's replica; skips turns already recorded. With
        `planned` (open loop: turn -> seconds after the point's start at `wall0`), a turn waits for its time."""
        prev_input = prev_output = None
        failed: int | None = None
        counts = stop.counts
        for n, turn in enumerate(session.turns):
            key = point_key(pool.name, point.label, session.session_id, n)
            done = self.existing.get(key)
            if done is not None:  # recorded by an earlier process
                if done.failed and failed is None:
                    failed = n
                prev_input, prev_output = self.resumed_io.get(key, (None, None))
                continue
            if failed is None:
                t_planned = None
                if planned is not None and not stop.stop(planned[n]):  # a time bound needs no waiting
                    t_planned = wall0 + planned[n]
                    await stop.sleep(t_planned - time.time())
                if stop.stop(None if planned is None else planned[n]):
                    counts.unsent += sum(point_key(pool.name, point.label, session.session_id, m)
                                         not in self.existing for m in range(n, len(session.turns)))
                    return
                ids = session.turn_input(n, prev_input, prev_output)
                prev = point_key(pool.name, point.label, session.session_id, n - 1) if n else None
                rec = await self.candidate(pool, point, index, session, n, ids, key, prev, t_planned)
                counts.sent += 1
                counts.failed += rec["error"] is not None
                counts.answered += rec["error"] is None
            else:
                rec = self._record(pool, None, point, session, n, [], turn.max_new_tokens, None, time.time(), 0,
                                   f"not run: turn {failed} of the session failed", key)
                self._write_candidate(pool, rec)
                counts.skipped += 1
            if rec["error"] is not None and failed is None:
                failed = n
            prev_input, prev_output = rec["input_ids"], rec["output_ids"]

    async def candidate(self, pool: Pool, point: Point, index: int, session, turn: int, ids: list[int],
                        key: str, prev_key: str | None = None, t_planned: float | None = None) -> dict:
        """Send one candidate request (and start its reference), record the answer."""
        h = input_hash(ids)
        max_new = session.turns[turn].max_new_tokens
        ref = self.reference_for(ids, h, max_new, session, turn)
        payload = pool.backend.payload(ids, max_new, stream=True)
        t_start = time.time()
        self.sent[pool.name] = self.sent.get(pool.name, 0) + 1
        replica, gen, retries, error = await self.send(pool, index, payload, key)
        rec = self._record(pool, replica, point, session, turn, ids, max_new, gen, t_start, retries, error,
                           key, h, t_planned)
        if replica is not None:
            self.served[key] = (replica.replica_id, replica.incarnation)
            rec["cache_lost"] = self._cache_lost(prev_key, self.served[key])
        rest = None
        if self.windows and wants_window(gen, error, len(ids)):
            fields, rest = await candidate_probe(self, pool, point.label, index, ids, h, gen.cached_tokens, key)
            rec.update(fields)
        done = partial(self._written, pool, rec, ref)
        if rest is None:
            done({})
        else:  # the record waits for the reference's probe, the session does not (harness/window.py)
            self.ref_windows.finish_later((pool.name, point.label), rest, done)
        return rec

    def _written(self, pool: Pool, rec: dict, ref: asyncio.Future, fields: dict) -> None:
        rec.update(fields)
        self._write_candidate(pool, rec)
        # the comparison waits for the reference holding a summary: a record (tokens, top-k) kept until its
        # reference answers would pile up wherever candidates answer faster than references
        ref.add_done_callback(partial(self._compare, Recorded.of(rec)))

    def _cache_lost(self, prev_key: str | None, served: tuple[str, int]) -> str | None:
        """Why this turn could not find the cache its previous turn left (so its restore path went untested):
        "resume" (that turn was recorded by an earlier process), "replica restart", "fail-over"; else None."""
        if prev_key is None:
            return None
        if prev_key in self.existing:
            return "resume"
        before = self.served.pop(prev_key, None)  # only its next turn asks
        if before is None or before == served:
            return None
        return "fail-over" if before[0] != served[0] else "replica restart"

    def _write_candidate(self, pool: Pool, rec: dict) -> None:
        self.files.write(candidate_file(pool.name), rec)
        self.failed[pool.name] = self.failed.get(pool.name, 0) + (rec["error"] is not None)
        self.progress.candidate(rec)

    def _compare(self, rec: Recorded, fut: asyncio.Future) -> None:
        if not fut.cancelled() and fut.exception() is None and rec.differs(fut.result()):
            self.progress.mismatch()

    async def send(self, pool: Pool, preferred: int, payload: dict, key: str
                   ) -> tuple[Replica | None, Generation | None, int, str | None]:
        """POST to the preferred healthy replica, re-sending after replica failures (harness/driver_send.py)."""
        return await send(self, pool, preferred, payload, key)

    def _record(self, pool: Pool, replica: Replica | None, point: Point | None, session, turn: int,
                ids: list[int], max_new: int, gen, t_start: float, retries: int, error: str | None, key: str,
                h: str | None = None, t_planned: float | None = None) -> dict:
        if gen is not None and not gen.output_text and gen.output_ids and self.decode is not None:
            try:
                gen = dataclasses.replace(gen, output_text=self.decode(gen.output_ids))
            except ValueError:  # an id outside the tokenizer's vocabulary: the record keeps no text
                pass
        return build_record(
            run_id=self.run_id, key=key, role=pool.role, pool=pool.name, engine=pool.engine_record(replica),
            concurrency=point.concurrency if point else None, replica_id=replica.replica_id if replica else "",
            node_id=replica.node_id if replica else None, session=session, turn=turn, input_ids=ids,
            input_hash=h or input_hash(ids), max_new_tokens=max_new, gen=gen, t_start=t_start, retries=retries,
            error=error, tokenizer=self.tokenizers.get(pool.name, "byte"), t_planned=t_planned,
            request_rate=point.rate if point else None, arrival=point.arrival if point else None)
