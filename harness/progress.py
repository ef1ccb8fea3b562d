"""Live progress of a run: counters of candidates, references, errors, mismatches and retries, one line per
finished sweep point whose counts add up, and lines while replicas start (printed with --no-progress too).
Without a live bar (off a terminal, or --no-progress) a line of the counters is printed every `heartbeat`
seconds, so a long run in a CI log never looks hung."""

from __future__ import annotations

import shutil
import sys
import threading
import time

from tqdm import tqdm


class Progress:
    """Counters of the run so far, shown as a live tqdm bar (or per-sweep-point lines only)."""

    def __init__(self, total: int, initial: int, enabled: bool, heartbeat: float | None = None) -> None:
        self.enabled, self.total, self.t0 = enabled, total, time.monotonic()
        self.done = initial  # candidate records, including those of an earlier (resumed) process
        self.errors = self.mismatches = self.retries = self.references = 0
        self.points: list = []  # the PointCounts of every sweep point this process finished
        # a pty that reports a 0x0 size would make tqdm hide the bar; shutil falls back to 110x24
        size = shutil.get_terminal_size((110, 24))
        self.bar = tqdm(total=total, initial=initial, disable=not enabled, unit="req", desc="candidates",
                        ncols=size.columns, nrows=size.lines)
        self._stop = threading.Event()
        self._beat = None
        if heartbeat and not enabled:
            self._beat = threading.Thread(target=self._heartbeat, args=(heartbeat,), daemon=True,
                                          name="specgate-progress")
            self._beat.start()

    def line(self, now: float | None = None) -> str:
        """The counters so far, as one line (what the heartbeat prints)."""
        elapsed = (time.monotonic() if now is None else now) - self.t0
        return (f"progress {elapsed // 60:.0f}m{elapsed % 60:02.0f}s: {self.done}/{self.total} candidates answered, "
                f"{self.references} references, {self.mismatches} with other tokens than their reference (the "
                f"verdict also judges log-prob drift), {self.errors} errors, {self.retries} retries")

    def _heartbeat(self, every: float) -> None:
        while not self._stop.wait(every):
            print(self.line(), flush=True)

    def _refresh(self) -> None:
        if not self.enabled:  # tqdm formats the postfix even for a disabled bar: per request, client CPU
            return
        self.bar.set_postfix(errors=self.errors, mismatches=self.mismatches, retries=self.retries,
                             refs=self.references, refresh=False)

    def candidate(self, record: dict) -> None:
        self.done += 1
        self.errors += record["error"] is not None
        if self.enabled:
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

    def add(self, done: int = 0, errors: int = 0, mismatches: int = 0, retries: int = 0, references: int = 0) -> None:
        """Counts recorded by another process (a driver actor, harness/driver_actors.py), merged into these."""
        self.done += done
        self.errors += errors
        self.mismatches += mismatches
        self.retries += retries
        self.references += references
        if self.enabled and done:
            self.bar.update(done)
        self._refresh()

    def point(self, pool: str, point, counts) -> None:
        """A sweep point finished: print its counts (harness/sweep.py PointCounts.line)."""
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
        self._stop.set()
        if self._beat is not None:
            self._beat.join(5)
        self.bar.close()


class StartupProgress:
    """Lines while replicas start: how many of how many are healthy and for how long it has waited (on stderr,
    with --no-progress too: a server can take minutes to start, and a silent console reads as a hang)."""

    def __init__(self, what: str, total: int, out=None) -> None:
        self.what, self.total = what, total
        self.out = out if out is not None else sys.stderr
        self.t0 = time.monotonic()

    def update(self, healthy: int, now: float | None = None) -> str:
        """Print and return the line for `healthy` of the total now."""
        now = time.monotonic() if now is None else now
        line = f"{self.what}: {healthy}/{self.total} healthy, waited {now - self.t0:.0f}s"
        print(line, file=self.out, flush=True)
        return line


def wait_all(refs: list, timeout: float, what: str = "replicas", every: float = 10.0, ray_api=None) -> list:
    """`ray.get(refs)` that prints a StartupProgress line at the start, every `every` seconds and when all are
    ready (GetTimeoutError after `timeout` s; a failed ref raises as soon as it is ready). `ray_api`: a module
    with ray's `wait`/`get`/`exceptions` (tests)."""
    if ray_api is None:
        import ray as ray_api
    reporter = StartupProgress(what, len(refs))
    reporter.update(0)
    deadline = time.monotonic() + timeout
    pending = list(refs)
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ray_api.exceptions.GetTimeoutError(f"{what}: {len(pending)} of {len(refs)} not ready in {timeout:g}s")
        done, pending = ray_api.wait(pending, num_returns=len(pending), timeout=min(every, left))
        ray_api.get(done)  # a replica that failed to start raises now, not when the others are up
        reporter.update(len(refs) - len(pending))
    return ray_api.get(refs)
