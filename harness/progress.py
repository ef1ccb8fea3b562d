"""Live progress of a run: counters of candidates, references, errors, mismatches and retries, one line per
finished sweep point whose counts add up, and lines while replicas start (printed with --no-progress too)."""

from __future__ import annotations

import shutil
import sys
import time

from tqdm import tqdm


class Progress:
    """Counters of the run so far, shown as a live tqdm bar (or per-sweep-point lines only)."""

    def __init__(self, total: int, initial: int, enabled: bool) -> None:
        self.enabled = enabled
        self.done = initial  # candidate records, including those of an earlier (resumed) process
        self.errors = self.mismatches = self.retries = self.references = 0
        self.points: list = []  # the PointCounts of every sweep point this process finished
        # a pty that reports a 0x0 size would make tqdm hide the bar; shutil falls back to 110x24
        size = shutil.get_terminal_size((110, 24))
        self.bar = tqdm(total=total, initial=initial, disable=not enabled, unit="req", desc="candidates",
                        ncols=size.columns, nrows=size.lines)

    def _refresh(self) -> None:
        self.bar.set_postfix(errors=self.errors, mismatches=self.mismatches, retries=self.retries,
                             refs=self.references, refresh=False)

    def candidate(self, record: dict) -> None:
        self.done += 1
        self.errors += record["error"] is not None
        self.bar.update(1)
        self._refresh()

    def reference(self, record: dict) -> None:
        self.references += 1
        self._refresh()

    def retry(self) -> None:
        self.retries += 1
        self._refresh()

    def mismatch(self) -> None:
        self.mismatches += 1
        self._refresh()

    def point(self, pool: str, point, counts) -> None:
        """A sweep point finished: print its counts (harness/driver_point.py PointCounts.line)."""
        self.points.append(counts)
        self.write(counts.line(pool, point))

    def summary(self) -> str:
        """The run's closing line: what this process sent, answered, failed and skipped, over all points."""
        total = {k: sum(getattr(c, k) for c in self.points) for k in ("sent", "answered", "failed", "skipped",
                                                                        "unsent", "warmup")}
        out = (f"candidates: {self.done} recorded; this process sent {total['sent']} ({total['answered']} "
               f"answered, {total['failed']} failed), skipped {total['skipped']} (an earlier turn failed)")
        if total["unsent"]:
            out += f", left {total['unsent']} unsent (points stopped early)"
        if total["warmup"]:
            out += f"; {total['warmup']} warmup requests (not gated)"
        return out + (f"; {self.mismatches} mismatches (output ids differ from the reference), "
                      f"{self.retries} retries")

    def write(self, line: str) -> None:
        if self.enabled:
            tqdm.write(line)
        else:
            print(line, flush=True)

    def close(self) -> None:
        self.bar.close()


class StartupProgress:
    """Lines while replicas start: how many of how many are healthy and for how long it has waited, at most
    one every `every` seconds and whenever the healthy count changes (on stderr, with --no-progress too)."""

    def __init__(self, what: str, total: int, every: float = 10.0, out=None) -> None:
        self.what, self.total, self.every = what, total, every
        self.out = out if out is not None else sys.stderr
        self.t0 = time.monotonic()
        self.last_t: float | None = None
        self.last_healthy = -1

    def update(self, healthy: int, now: float | None = None) -> str | None:
        """Report `healthy` of the total; returns the line printed (None when nothing was due)."""
        now = time.monotonic() if now is None else now
        due = self.last_t is None or now - self.last_t >= self.every or healthy != self.last_healthy
        if not due:
            return None
        self.last_t, self.last_healthy = now, healthy
        line = f"{self.what}: {healthy}/{self.total} healthy, waited {now - self.t0:.0f}s"
        print(line, file=self.out, flush=True)
        return line
