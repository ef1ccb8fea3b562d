"""Open-loop arrival schedules: when each request of a `--request-rate` sweep point is planned to be sent.

A rate sweep point plans one send time per request, in turn rounds: every session's turn 0 first (sessions in
workload order), then every session's turn 1, and so on, so that a session's later turn is planned after
all first turns and many sessions are in flight at once (the batch composition changes all the time). The
gaps are constant (1/rate) or exponential with mean 1/rate (a Poisson process) from a seeded generator, so
a schedule is the same for the same seed. Pure functions.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from harness.config import ARRIVALS


def gaps(n: int, rate: float, arrival: str, seed: int) -> list[float]:
    """`n` gaps in seconds between consecutive planned sends (the first is 0: the point starts sending)."""
    if rate <= 0:
        raise ValueError(f"--request-rate must be > 0, got {rate}")
    if arrival == "constant":
        return [0.0] + [1.0 / rate] * (n - 1) if n else []
    if arrival == "poisson":
        # one generator per (seed, rate): another point's schedule does not shift this one's
        rng = random.Random(f"{seed}:{rate!r}")
        return [0.0] + [rng.expovariate(rate) for _ in range(n - 1)] if n else []
    raise ValueError(f"--arrival must be one of {', '.join(ARRIVALS)}, got {arrival!r}")


def turn_rounds(turn_counts: Sequence[int]) -> list[tuple[int, int]]:
    """(session index, turn) in planned order: all turns 0, then all turns 1, ... (shorter sessions drop out)."""
    rounds = max(turn_counts, default=0)
    return [(s, n) for n in range(rounds) for s, count in enumerate(turn_counts) if n < count]


def schedule(turn_counts: Sequence[int], rate: float, arrival: str, seed: int) -> dict[tuple[int, int], float]:
    """(session index, turn) -> planned send offset in seconds from the point's start."""
    order = turn_rounds(turn_counts)
    out, t = {}, 0.0
    for slot, gap in zip(order, gaps(len(order), rate, arrival, seed), strict=True):
        t += gap
        out[slot] = t
    return out
