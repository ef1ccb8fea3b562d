"""The sweep points of a pool: each one's shape (closed loop or open loop), its stop rule and its counts.

A closed-loop point (`--concurrency C`) keeps C sessions in flight; an open-loop point (`--request-rate R`)
sends each request at its planned time (harness/arrival.py), a session's turn no earlier than its previous
turn's answer. Either may be bounded by `--duration` (seconds of sending) and `--max-error-rate` (a fraction
of the point's answered requests that failed): what is not sent by then is left unrecorded and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import asdict, dataclass

from records.schema import point_record_key


@dataclass(frozen=True)
class Point:
    """A sweep point's shape: `concurrency` (closed loop) or `rate` and `arrival` (open loop)."""

    concurrency: int | None = None
    rate: float | None = None
    arrival: str | None = None

    @property
    def label(self) -> str:
        """`c4` or `r2.5`: the point's name in record keys and on the console."""
        return f"c{self.concurrency}" if self.rate is None else f"r{self.rate:g}"

    @property
    def title(self) -> str:
        """How the console names the point: `c=4` or `rate=2.5/s poisson`."""
        return f"c={self.concurrency}" if self.rate is None else f"rate={self.rate:g}/s {self.arrival}"


def sweep(concurrency: tuple[int, ...], request_rate: tuple[float, ...], arrival: str) -> list[Point]:
    """The sweep points of a pool, in the order they run: the concurrency levels, then the request rates."""
    return [Point(concurrency=c) for c in concurrency] + [Point(rate=r, arrival=arrival) for r in request_rate]


@dataclass
class PointCounts:
    """What one sweep point did in this process; `planned = sent + skipped + unsent` and
    `sent = answered + failed` (a resumed point counts only what this process had left to do)."""

    planned: int = 0
    sent: int = 0
    answered: int = 0
    failed: int = 0
    skipped: int = 0  # not sent because an earlier turn of the session failed (recorded, counted as errors)
    unsent: int = 0  # not sent because the point was stopped (--duration, --max-error-rate): not recorded
    warmup: int = 0
    warmup_failed: int = 0
    stopped: str | None = None  # why the point stopped early
    wall_s: float = 0.0

    def line(self, pool: str, point: Point) -> str:
        """The console line of a finished point; its counts add up (see the class doc)."""
        out = (f"{pool} {point.title}: {self.sent} sent, {self.answered} answered, {self.failed} failed, "
               f"{self.skipped} skipped (an earlier turn failed) in {self.wall_s:.1f}s")
        if self.warmup:
            out += f"; warmup {self.warmup} sent ({self.warmup_failed} failed), not gated"
        if self.stopped:
            out += f"; stopped early ({self.stopped}): {self.unsent} not sent"
        return out


class StopRule:
    """When a point stops sending: a request planned (open loop) or due (closed loop) `duration` seconds or more
    after the point's start is not sent; once more than `max_error_rate` of the point's answered requests
    failed, nothing more is sent. `reason` says which stopped it, for the point's record."""

    def __init__(self, duration: float | None, max_error_rate: float | None, counts: PointCounts) -> None:
        self.duration, self.max_error_rate, self.counts = duration, max_error_rate, counts
        self.t0 = time.perf_counter()
        self.stopped = asyncio.Event()  # set by an error stop: wakes the requests that wait for their time
        self.timed_out = False  # some request was past the duration
        self.error_stop: str | None = None

    @property
    def reason(self) -> str | None:
        """Why requests were left unsent (the error stop first: it cut the point short), or None."""
        if self.error_stop:
            return self.error_stop
        return f"reached --duration {self.duration:g}s" if self.timed_out else None

    async def sleep(self, delay: float) -> None:
        """Sleep `delay` seconds, or until an error stop."""
        if delay > 0 and not self.stopped.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stopped.wait(), delay)

    def stop(self, planned_offset: float | None = None) -> bool:
        """True when a request (planned `planned_offset` seconds after the start; None: due now) must not be
        sent."""
        if self.duration is not None:
            at = time.perf_counter() - self.t0 if planned_offset is None else planned_offset
            if at >= self.duration:
                self.timed_out = True
                return True
        c = self.counts
        done = c.answered + c.failed
        if (self.error_stop is None and self.max_error_rate is not None and done
                and c.failed / done > self.max_error_rate):
            self.error_stop = f"over --max-error-rate {self.max_error_rate:g}: {c.failed}/{done} failed"
            self.stopped.set()
        return self.error_stop is not None


def point_record(*, run_id: str, pool: str, point: Point, counts: PointCounts, t_start: float, t_end: float,
                 warmup: int, duration: float | None, max_error_rate: float | None) -> dict:
    """The JSON-ready record of a finished sweep point (role "point", docs/load.md)."""
    c = asdict(counts)
    return {"schema": 1, "run_id": run_id, "key": point_record_key(pool, point.label), "role": "point",
            "pool": pool, "point": point.label, "concurrency": point.concurrency, "request_rate": point.rate,
            "arrival": point.arrival, "warmup_requests": warmup, "duration": duration,
            "max_error_rate": max_error_rate, **c, "t_start": t_start, "t_end": t_end}
