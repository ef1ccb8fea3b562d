"""Exact one-sided tests of event counts, and the family-wise level across many of them.

Two groups of turns, `a` and `b`, each turn with or without an event (a token flip, a drift onset). Conditional on
how many turns each group has and how many events they have together, the events of `a` follow the
hypergeometric law when the groups do not differ (Fisher's exact test): P(X = x) = C(K, x) C(N - K, n - x) /
C(N, n), with N turns, K events, n of the turns in `a`. The one-sided p-value is P(X >= the events seen in `a`).
Where the turns fall into strata (sweep points: each has its own batches and so its own numerics), the test
conditions on every stratum's margins and sums the strata (the exact conditional test behind Mantel-Haenszel):
the law of the summed events of `a` is the convolution of the strata's hypergeometric laws. Every count is an
integer and every probability a ratio of integers, so the p-values are exact (a float only at the end).

Integer arithmetic grows with the table: C(N, n) of a stratum of tens of thousands of turns has thousands of
digits, and a soak run's tests would take minutes. Where a stratum holds more than EXACT_TURNS turns, the laws are
computed in floating point instead (`_float_test`): each stratum's probabilities from log-binomials, those below
e^-200 of its largest left out, the strata convolved in float64. Its p-values agree with the integer ones to 1e-9
relative down to 1e-60 (tests/reports/test_exact_test.py); below about 1e-80 they lose digits, far from any
level a family uses.

A discrete test cannot reach every level: with its margins fixed, the smallest p-value it can give is that of
its most extreme table (`ExactTest.p_min`). Tarone's procedure uses that to size the family: a test that could
not reach the per-test level even with every event in `a` cannot reject, so it does not count toward the
Bonferroni divisor (`tarone_level`); the family-wise error rate stays at most the level.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import comb, exp, lgamma

import numpy as np

EXACT_TURNS = 4000  # strata up to this many turns keep integer arithmetic; any larger one: the float law
_TRIM = 200.0  # a float law keeps probabilities within e^-200 of its stratum's largest


@dataclass(frozen=True)
class Stratum:
    """One stratum's 2 x 2 table: events and turns of group a (under test) and of group b (the comparison)."""

    events_a: int
    turns_a: int
    events_b: int
    turns_b: int

    def __post_init__(self):
        assert 0 <= self.events_a <= self.turns_a and 0 <= self.events_b <= self.turns_b, self

    def weights(self) -> tuple[int, list[int]]:
        """(the smallest events of a these margins allow, the number of tables with each count from there):
        C(K, x) C(N - K, n - x) for x = lo .. hi."""
        n, k = self.turns_a, self.events_a + self.events_b
        total = n + self.turns_b
        lo, hi = max(0, k - self.turns_b), min(k, n)
        return lo, [comb(k, x) * comb(total - k, n - x) for x in range(lo, hi + 1)]

    def log_law(self) -> tuple[int, np.ndarray]:
        """(lo, the log-probability of each count of a's events from lo to hi under these margins)."""
        n, k = self.turns_a, self.events_a + self.events_b
        total = n + self.turns_b
        lo, hi = max(0, k - self.turns_b), min(k, n)
        return lo, np.array([_log_comb(k, x) + _log_comb(total - k, n - x) for x in range(lo, hi + 1)]) \
            - _log_comb(total, n)


def _log_comb(a: int, b: int) -> float:
    return lgamma(a + 1) - lgamma(b + 1) - lgamma(a - b + 1)


@dataclass(frozen=True)
class ExactTest:
    """A one-sided exact test that group a has more events than group b (per stratum, summed over strata)."""

    p: float  # P(events of a >= those seen | every stratum's margins), under no difference
    p_min: float  # the smallest p-value these margins can give (every event of every stratum in a where it fits)
    events_a: int
    turns_a: int
    events_b: int
    turns_b: int


def exact_test(strata: Sequence[Stratum]) -> ExactTest:
    """The exact conditional one-sided test over `strata` (one stratum: Fisher's exact test, alternative
    `greater`). Strata with no turns in a group, or no events, carry no information and change nothing. Where a
    stratum has more than EXACT_TURNS turns: the float law (_float_test)."""
    if any(s.turns_a + s.turns_b > EXACT_TURNS for s in strata):
        return _float_test(strata)
    lo, dist = 0, [1]  # the law of the summed events of a, as integer weights from `lo` on
    denominator = 1
    for s in strata:
        s_lo, w = s.weights()
        dist = [sum(dist[i] * w[t - i] for i in range(max(0, t - len(w) + 1), min(t, len(dist) - 1) + 1))
                for t in range(len(dist) + len(w) - 1)]
        lo += s_lo
        denominator *= comb(s.turns_a + s.turns_b, s.turns_a)
    seen = sum(s.events_a for s in strata)
    p = sum(dist[seen - lo:]) / denominator
    return ExactTest(min(1.0, p), dist[-1] / denominator, seen, sum(s.turns_a for s in strata),
                     sum(s.events_b for s in strata), sum(s.turns_b for s in strata))


def _float_test(strata: Sequence[Stratum]) -> ExactTest:
    """exact_test's law in float64 (see the module doc): for strata too large for integer arithmetic."""
    lo, dist, log_p_min = 0, np.ones(1), 0.0
    for s in strata:
        s_lo, log = s.log_law()
        log_p_min += float(log[-1])
        keep = np.flatnonzero(log >= log.max() - _TRIM)
        first, last = int(keep[0]), int(keep[-1])
        dist = np.convolve(dist, np.exp(log[first:last + 1]))
        lo += s_lo + first
    seen = sum(s.events_a for s in strata)
    at = seen - lo
    p = 1.0 if at <= 0 else (0.0 if at >= len(dist) else float(dist[at:].sum()))
    return ExactTest(min(1.0, p), exp(log_p_min), seen, sum(s.turns_a for s in strata),
                     sum(s.events_b for s in strata), sum(s.turns_b for s in strata))


def fisher_greater(events_a: int, turns_a: int, events_b: int, turns_b: int) -> float:
    """Fisher's exact one-sided p-value that a's event rate exceeds b's (one 2 x 2 table)."""
    return exact_test([Stratum(events_a, turns_a, events_b, turns_b)]).p


def tarone_level(p_mins: Sequence[float], alpha: float) -> tuple[float, int]:
    """Tarone's family size: the smallest K with at most K tests able to reach alpha / K (p_min <= alpha / K);
    the per-test level alpha / K and K. Every test rejects at p <= alpha / K; the family-wise error rate, over all
    of `p_mins`' tests, stays at most alpha."""
    for k in range(1, len(p_mins) + 1):
        if sum(1 for p in p_mins if p <= alpha / k) <= k:
            return alpha / k, k
    return alpha / max(1, len(p_mins)), max(1, len(p_mins))
