"""Open-loop schedules (harness/arrival.py) and the sweep-point bookkeeping (harness/sweep.py)."""

from __future__ import annotations

import pytest

from harness.arrival import gaps, schedule, turn_rounds
from harness.sweep import Point, PointCounts, StopRule, sweep


def test_constant_gaps_are_one_over_the_rate():
    assert gaps(4, 2.0, "constant", 0) == [0.0, 0.5, 0.5, 0.5]
    assert gaps(0, 2.0, "constant", 0) == []


def test_poisson_gaps_are_seeded_exponential():
    a, b, other = gaps(2001, 4.0, "poisson", 7), gaps(2001, 4.0, "poisson", 7), gaps(2001, 4.0, "poisson", 8)
    assert a == b and a != other and a[0] == 0.0
    mean = sum(a[1:]) / 2000
    assert abs(mean - 0.25) < 0.02  # mean gap 1/rate (2000 draws: standard error 0.0056)
    assert len(set(a[1:])) == 2000 and min(a[1:]) > 0


def test_poisson_schedule_of_one_rate_does_not_depend_on_other_points():
    assert gaps(5, 2.0, "poisson", 3) == gaps(5, 2.0, "poisson", 3)
    assert gaps(5, 2.0, "poisson", 3) != gaps(5, 3.0, "poisson", 3)


def test_unknown_arrival_and_bad_rate_name_the_flag():
    with pytest.raises(ValueError, match="--arrival"):
        gaps(3, 1.0, "bursty", 0)
    with pytest.raises(ValueError, match="--request-rate"):
        gaps(3, 0.0, "constant", 0)


def test_turn_rounds_put_every_first_turn_before_any_second():
    assert turn_rounds([2, 1, 3]) == [(0, 0), (1, 0), (2, 0), (0, 1), (2, 1), (2, 2)]
    assert schedule([2, 1], 4.0, "constant", 0) == {(0, 0): 0.0, (1, 0): 0.25, (0, 1): 0.5}


def test_sweep_points_and_labels():
    points = sweep((1, 4), (0.5, 2.0), "poisson")
    assert [p.label for p in points] == ["c1", "c4", "r0.5", "r2"]
    assert points[2] == Point(rate=0.5, arrival="poisson") and points[2].title == "rate=0.5/s poisson"


def test_point_counts_line_adds_up():
    c = PointCounts(planned=10, sent=6, answered=5, failed=1, skipped=1, unsent=3, warmup=2,
                    stopped="reached --duration 5s", wall_s=5.04)
    assert c.planned == c.sent + c.skipped + c.unsent and c.sent == c.answered + c.failed
    assert c.line("i128", Point(concurrency=4)) == (
        "i128 c=4: 6 sent, 5 answered, 1 failed, 1 skipped (an earlier turn failed) in 5.0s; warmup 2 sent "
        "(0 failed), not gated; stopped early (reached --duration 5s): 3 not sent")


def test_stop_rule_duration_by_planned_time_and_error_rate():
    c = PointCounts()
    rule = StopRule(10.0, None, c)
    assert rule.stop(10.0) and not rule.stop(9.99)  # a later request past the bound leaves earlier ones be
    assert rule.reason == "reached --duration 10s" and not rule.stopped.is_set()
    assert StopRule(10.0, None, c).reason is None
    c = PointCounts(answered=3, failed=1)
    rule = StopRule(None, 0.25, c)
    assert not rule.stop()  # 1/4 failed: not more than the allowed fraction
    c.failed = 2
    assert rule.stop() and rule.reason == "over --max-error-rate 0.25: 2/5 failed" and rule.stopped.is_set()
    c.failed = 0
    assert rule.stop()  # an error stop is for good
