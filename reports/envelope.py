"""The drift envelope: how much log-prob drift a clean path accumulates over a turn's first n output tokens.

A noisy target's numerics move log-probs a little at every token and the moves grow
with distance (the contexts of the two runs drift apart): a whole-turn tolerance must
allow the largest late move a clean control showed (bf16: ~0.2). A wrong state (a
stale restore, a bad verify step) moves the log-probs from the turn's first tokens
and at every step after: early, where clean numerics are small, it shows. So the
calibration (harness/calibrate.py) also records, per control, the cumulative drift
(the sum of the per-position drifts, reports/oracle.py `position_drift`) over the first
n outputs for each n of LADDER, and a gated pool's envelope at n is
ENVELOPE_FACTOR x the largest control's sum there (never below DRIFT_FLOOR x n). A turn
whose sum over its first outputs passes the envelope at the ladder point that covers
them is drift, with its onset where it passed. Measured on the bf16 built-in engine
(frozen suite, I=128, c=4): clean candidates reach at most 1.5x their controls'
envelope; turns that restored a stale checkpoint, 1.06x to 46x (28 of 30 above 3x).

Sums are taken left to right (itertools.accumulate): the array oracle (reports/oracle_vec.py) adds the same
float64 values in the same order, so the two agree bit for bit.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

# output counts at which the cumulative drift is calibrated: the first token (the prefill's), the first verify
# steps, then doubling; a turn longer than the last point is held to the last point's limit
LADDER: tuple[int, ...] = (1, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
ENVELOPE_FACTOR = 3.0
DRIFT_FLOOR = 1e-4  # per position: below this, differences are float32 rounding (harness/calibrate.py)


@dataclass(frozen=True)
class Envelope:
    """The cumulative drift allowed over the first LADDER[k] outputs, for each k."""

    limits: tuple[float, ...]

    def limit_at(self, i: int) -> float:
        """The limit for the sum over outputs [0, i]: that of the smallest ladder point covering i + 1 outputs."""
        k = bisect.bisect_left(LADDER, i + 1)
        return self.limits[min(k, len(self.limits) - 1)]

    def onset(self, diffs: Sequence[float]) -> tuple[int, float, float] | None:
        """(output index, cumulative drift, limit) where the running sum of `diffs` (one per compared position,
        in order) first passes the envelope; None if it never does."""
        for i, total in enumerate(accumulate(diffs)):
            limit = self.limit_at(i)
            if total > limit:
                return i, total, limit
        return None

    @classmethod
    def of(cls, sums: Sequence[Sequence[float]], factor: float = ENVELOPE_FACTOR) -> Envelope | None:
        """The envelope over controls whose ladder sums (ladder_sums) are `sums`; None without any."""
        if not sums:
            return None
        return cls(tuple(max(DRIFT_FLOOR * n, factor * max(s[k] for s in sums)) for k, n in enumerate(LADDER)))

    @classmethod
    def from_json(cls, value) -> Envelope | None:
        """An envelope from config.json (a list of limits, or {"limits": [...]}); None for none."""
        if isinstance(value, dict):
            value = value.get("limits")
        if not value:
            return None
        return cls(tuple(float(v) for v in value))


def ladder_sums(diffs: Sequence[float]) -> tuple[float, ...]:
    """The cumulative drift over the first n compared positions, for each n of LADDER (the whole turn's sum
    where it is shorter)."""
    running = list(accumulate(diffs))
    total = running[-1] if running else 0.0
    return tuple(running[n - 1] if n <= len(running) else total for n in LADDER)
