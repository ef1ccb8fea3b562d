"""Is the engine loop alive? A heartbeat the loop beats once per iteration, and the test-only loop faults.

A loop that raised is dead at once (AsyncEngine.fail). A loop that hangs (a
collective that never returns, a deadlock) raises nothing, so the loop beats a
`Heartbeat` at the top of every iteration (idle iterations last at most 50 ms):
`/health` reads unhealthy once the last beat is older than `--heartbeat-timeout`,
and the watchdog fails the engine, so that the server exits and its supervisor
restarts it, once it is older than `--watchdog-timeout`.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass

FAULT_KINDS = ("raise", "hang")


class Heartbeat:
    """The engine loop's last sign of life (monotonic seconds)."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    def beat(self) -> None:
        self.last = time.monotonic()

    def silent_for(self) -> float:
        """Seconds since the last beat."""
        return time.monotonic() - self.last


@dataclass(frozen=True)
class LoopFault:
    """Test aid (`--test-loop-fault raise-after:N` / `hang-after:N`): the engine loop raises, or blocks for good,
    at its step N+1. Not a bug model (those are engine/faults.py): it stands for any crash or hang of the loop,
    so that tests can show a broken engine still yields a verdict in bounded time."""

    kind: str
    after: int

    @classmethod
    def parse(cls, text: str) -> LoopFault:
        """`raise-after:N` or `hang-after:N`; ValueError naming the flag otherwise."""
        m = re.fullmatch(r"(raise|hang)-after:(\d+)", text or "")
        if m is None:
            raise ValueError(f"--test-loop-fault must be raise-after:N or hang-after:N, got {text!r}")
        return cls(m.group(1), int(m.group(2)))

    def check(self, steps_done: int) -> None:
        """Called before each step with the number of steps done so far."""
        if steps_done < self.after:
            return
        if self.kind == "raise":
            raise RuntimeError(f"test fault: the engine loop raised at step {steps_done + 1} "
                               f"(--test-loop-fault raise-after:{self.after})")
        threading.Event().wait()  # hang: never returns; the watchdog has to notice


def watch(is_done, silent_for, limit: float, on_stall, poll: float = 0.5) -> threading.Thread:
    """Start a daemon thread that calls `on_stall(seconds)` once `silent_for()` exceeds `limit`.

    It stops once `is_done()` is true (the engine stopped or already failed).
    """
    def run() -> None:
        while not is_done():
            quiet = silent_for()
            if quiet > limit:
                on_stall(quiet)
                return
            time.sleep(poll)

    t = threading.Thread(target=run, name="engine-watchdog", daemon=True)
    t.start()
    return t
