"""The session loop: a sweep point's sessions, each turn in order on the session's replica.

All turns of a session go to one replica (its cache lives there) in order, and turn n+1 is built from turn n's
candidate output. A closed-loop point keeps C sessions in flight (so at most C requests); an open-loop point
sends each turn at its planned time (harness/arrival.py), no earlier than its previous turn's answer. Each turn
starts its reference (harness/references.py), and a turn that restored a checkpoint is probed
(harness/window.py). A turn recorded by an earlier process is skipped; once a turn fails, the session's later
turns are recorded as not run.
"""

from __future__ import annotations

import asyncio
import time
from functools import partial

from harness.arrival import schedule
from harness.pools import Pool
from harness.recorded import RunSoFar
from harness.recorder import Recorder
from harness.references import References
from harness.sender import Sender, Sent
from harness.sweep import Point, StopRule
from harness.window import WindowProbe
from records.resume import Recorded
from records.rundir import input_hash
from records.schema import point_key


def planned_offsets(todo: list[tuple[int, object]], point: Point, seed: int) -> dict[int, dict[int, float]]:
    """An open-loop point's plan (harness/arrival.py) for the sessions `todo`: index -> turn -> seconds after the
    point's start."""
    plan = schedule([len(s.turns) for _, s in todo], point.rate, point.arrival, seed)
    return {index: {n: plan[(k, n)] for n in range(len(session.turns))} for k, (index, session) in enumerate(todo)}


class SessionLoop:
    """Runs sessions of a pool at a sweep point; remembers which replica (and incarnation) answered each turn,
    until its next turn asks whether the cache it left is still there."""

    def __init__(self, *, sender: Sender, recorder: Recorder, references: References, windows: WindowProbe,
                 so_far: RunSoFar, seed: int) -> None:
        self.sender, self.recorder, self.references, self.windows = sender, recorder, references, windows
        self.so_far, self.seed = so_far, seed
        self.served: dict[str, tuple[str, int]] = {}  # candidate key -> (replica id, incarnation) that answered

    async def run(self, pool: Pool, point: Point, todo: list[tuple[int, object]], stop: StopRule,
                  wall0: float, concurrency: int | None = None,
                  planned: dict[int, dict[int, float]] | None = None) -> None:
        """Every session of `todo` ((index, session)) in the point's shape; `wall0`: the point's start. A driver
        actor running a share of the point gets its own `concurrency` (closed loop) or the `planned` offsets of
        its sessions (open loop: index -> turn -> seconds after `wall0`) from the whole point's plan."""
        if point.rate is None:
            queue = iter(todo)

            async def worker() -> None:
                for index, session in queue:
                    await self.session(pool, point, index, session, stop)

            runs = [worker() for _ in range(min(concurrency or point.concurrency, len(todo)))]
        else:
            planned = planned_offsets(todo, point, self.seed) if planned is None else planned
            runs = [self.session(pool, point, index, session, stop, wall0, planned[index]) for index, session in todo]
        await asyncio.gather(*runs)

    async def session(self, pool: Pool, point: Point, index: int, session, stop: StopRule, wall0: float = 0.0,
                      planned: dict[int, float] | None = None) -> None:
        """All turns of one session, in order, on the session's replica; skips turns already recorded. With
        `planned` (open loop: turn -> seconds after the point's start at `wall0`), a turn waits for its time."""
        prev_input = prev_output = None
        failed: int | None = None
        counts = stop.counts
        for n, turn in enumerate(session.turns):
            key = point_key(pool.name, point.label, session.session_id, n)
            done = self.so_far.candidates.get(key)
            if done is not None:  # recorded by an earlier process
                if done.failed and failed is None:
                    failed = n
                prev_input, prev_output = self.so_far.io.get(key, (None, None))
                continue
            if failed is None:
                t_planned = None
                if planned is not None and not stop.stop(planned[n]):  # a time bound needs no waiting
                    t_planned = wall0 + planned[n]
                    await stop.sleep(t_planned - time.time())
                if stop.stop(None if planned is None else planned[n]):
                    counts.unsent += sum(point_key(pool.name, point.label, session.session_id, m)
                                         not in self.so_far.candidates for m in range(n, len(session.turns)))
                    return
                ids = session.turn_input(n, prev_input, prev_output)
                prev = point_key(pool.name, point.label, session.session_id, n - 1) if n else None
                rec = await self.turn(pool, point, index, session, n, ids, key, prev, t_planned)
                counts.sent += 1
                counts.failed += rec["error"] is not None
                counts.answered += rec["error"] is None
            else:
                not_run = Sent(None, None, 0, f"not run: turn {failed} of the session failed")
                rec = self.recorder.record(pool, point, session, n, [], turn.max_new_tokens, key, time.time(),
                                           not_run)
                self.recorder.candidate(pool, rec)
                counts.skipped += 1
            if rec["error"] is not None and failed is None:
                failed = n
            prev_input, prev_output = rec["input_ids"], rec["output_ids"]

    async def turn(self, pool: Pool, point: Point, index: int, session, turn: int, ids: list[int], key: str,
                   prev_key: str | None = None, t_planned: float | None = None) -> dict:
        """Send one candidate request (and start its reference), record the answer; the record is written now,
        or once the reference half of its restore-window probe answered."""
        h = input_hash(ids)
        max_new = session.turns[turn].max_new_tokens
        ref = self.references.answer(ids, h, max_new, session, turn)
        payload = pool.backend.payload(ids, max_new, stream=True)
        t_start = time.time()
        sent = await self.sender.send(pool, index, payload, key)
        rec = self.recorder.record(pool, point, session, turn, ids, max_new, key, t_start, sent, h, t_planned)
        if sent.replica is not None:
            self.served[key] = (sent.replica.replica_id, sent.replica.incarnation)
            rec["cache_lost"] = self._cache_lost(prev_key, self.served[key])
        rest = None
        if self.windows.wants(sent.gen, sent.error, len(ids)):
            fields, rest = await self.windows.candidate_half(pool, point.label, index, ids, h,
                                                             sent.gen.cached_tokens, key)
            rec.update(fields)
        done = partial(self._written, pool, rec, ref)
        if rest is None:
            done({})
        else:  # the record waits for the reference's probe, the session does not (harness/window.py)
            self.windows.finish_later((pool.name, point.label), rest, done)
        return rec

    def _written(self, pool: Pool, rec: dict, ref: asyncio.Future, fields: dict) -> None:
        rec.update(fields)
        self.recorder.candidate(pool, rec)
        # the comparison waits for the reference holding a summary: a record (tokens, top-k) kept until its
        # reference answers would pile up wherever candidates answer faster than references
        self.references.compare(Recorded.of(rec), ref)

    def _cache_lost(self, prev_key: str | None, served: tuple[str, int]) -> str | None:
        """Why this turn could not find the cache its previous turn left (so its restore path went untested):
        "resume" (that turn was recorded by an earlier process), "replica restart", "fail-over"; else None."""
        if prev_key is None:
            return None
        if prev_key in self.so_far.candidates:
            return "resume"
        before = self.served.pop(prev_key, None)  # only its next turn asks
        if before is None or before == served:
            return None
        return "fail-over" if before[0] != served[0] else "replica restart"
