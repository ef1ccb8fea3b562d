"""The drift envelope (reports/envelope.py) and the oracle's use of it: a turn whose drift, summed over its first
outputs, passes its path's envelope is drift, although no single position passes the whole-turn tolerance."""

from __future__ import annotations

import pytest

from reports.envelope import DRIFT_FLOOR, LADDER, Envelope, ladder_sums
from reports.oracle import classify, compared_drifts


def _rec(ids, lps, top=None):
    rec = {"output_ids": list(ids), "output_logprobs": list(lps), "error": None}
    if top is not None:
        rec["output_top_logprobs"] = top
    return rec


def test_ladder_sums_are_running_sums_at_the_ladder_points_and_the_total_past_the_end():
    sums = ladder_sums([0.5, 0.25, 0.125, 0.125, 1.0])
    assert sums[:3] == (0.5, 1.0, 2.0) and all(s == 2.0 for s in sums[2:]) and len(sums) == len(LADDER)
    assert ladder_sums([]) == (0.0,) * len(LADDER)


def test_the_envelope_is_the_factor_times_the_largest_control_sum_with_a_floor_per_position():
    env = Envelope.of([ladder_sums([0.01] * 10), ladder_sums([0.0, 0.02])], factor=3.0)
    assert env.limits[0] == pytest.approx(0.03)  # max(0.01, 0.0) x 3
    assert env.limits[1] == pytest.approx(0.12)  # the 1st control over 4 outputs: 0.04 x 3
    assert env.limits[3] == pytest.approx(0.30)  # its whole turn (10 outputs) from 16 on
    assert env.limits[-1] == DRIFT_FLOOR * LADDER[-1]  # the floor grows with the outputs summed
    assert Envelope.of([]) is None
    assert Envelope.of([ladder_sums([0.0])]).limits[:2] == (DRIFT_FLOOR, 4 * DRIFT_FLOOR)


def test_limit_at_an_output_is_that_of_the_smallest_ladder_point_covering_it():
    env = Envelope(tuple(float(k) for k in range(len(LADDER))))
    assert [env.limit_at(i) for i in (0, 1, 3, 4, 7, 8, 15, 16)] == [0, 1, 1, 2, 2, 3, 3, 4]
    assert env.limit_at(10 ** 6) == len(LADDER) - 1  # past the last point: the last limit
    assert Envelope((1.0,)).limit_at(50) == 1.0


def test_onset_is_where_the_running_sum_first_passes():
    env = Envelope((0.1, 0.2, 0.3) + (1.0,) * (len(LADDER) - 3))
    assert env.onset([0.05, 0.1, 0.1]) == (2, pytest.approx(0.25), 0.2)  # 0.25 > 0.2 over outputs 0-2
    assert env.onset([0.05, 0.05, 0.05, 0.05]) is None
    assert env.onset([0.2]) == (0, 0.2, 0.1)
    assert Envelope.from_json([0.1, 0.2]) == Envelope((0.1, 0.2)) and Envelope.from_json(None) is None
    assert Envelope.from_json({"limits": [0.5]}) == Envelope((0.5,))


REF = _rec([1, 2, 3, 4, 5, 6], [-1.0] * 6)
# every position moves by 0.0625: within a whole-turn tolerance of 0.5, but summed 0.25 over the first 4 outputs
MOVED = _rec([1, 2, 3, 4, 5, 6], [-1.0625] * 6)
ENV = Envelope((0.1, 0.2) + (10.0,) * (len(LADDER) - 2))


def test_a_turn_past_the_envelope_is_drift_from_where_it_passed():
    c = classify(MOVED, REF, 0.5, 0.5, ENV)
    assert (c.cls, c.drift.onset, c.drift.envelope) == ("drift", 3, (0.25, 0.2))
    assert c.detail == "log-prob drift summed over outputs 0-3 0.25 > the path's envelope 0.2 there (max 0.0625)"
    assert classify(MOVED, REF, 0.5, 0.5).cls == "exact"  # no envelope: the tolerance alone
    assert classify(MOVED, REF, 0.5, 0.01, ENV).drift.envelope is None  # the tolerance passed first (output 0)


def test_a_flip_after_the_turn_passed_its_envelope_is_hard_not_a_numerics_flip():
    top = [[[-1.0, t], [-1.2, 9]] for t in [1, 2, 3, 4, 5, 6]]
    ref = _rec([1, 2, 3, 4, 5, 6], [-1.0] * 6, top)
    cand = _rec([1, 2, 3, 4, 5, 9], [-1.0625] * 6, [[[-1.0625, t], [-1.2, 9]] for t in [1, 2, 3, 4, 5, 9]])
    assert classify(cand, ref, 0.5, 0.5).cls == "soft"  # margin 0.2 < 0.5 and no drift past the tolerance
    c = classify(cand, ref, 0.5, 0.5, ENV)
    assert c.cls == "hard" and c.detail.endswith("before the flip at 5") and c.drift.onset == 3


def test_compared_drifts_are_the_positions_the_oracle_sums():
    assert compared_drifts(MOVED, REF) == [0.0625] * 6
    cand = _rec([1, 2, 7], [-1.5, -1.0, -1.0])
    assert compared_drifts(cand, REF) == [0.5, 0.0]  # up to the flip (no top-k there to compare)
