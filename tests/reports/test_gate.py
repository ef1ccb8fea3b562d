"""The release gate: thresholds, verdict, headline."""

from __future__ import annotations

import pandas as pd

from reports.exact_test import ExactTest
from reports.flip_rates import RateTest
from reports.gate import GateThresholds, evaluate


def frame(exact=0, soft=0, hard=0, error=0) -> pd.DataFrame:
    return pd.DataFrame({"class": ["exact"] * exact + ["soft"] * soft + ["hard"] * hard + ["error"] * error})


def test_clean_run_passes():
    v = evaluate(frame(exact=10))
    assert (v.passed, v.exit_code, v.reasons) == (True, 0, [])
    assert v.headline == "PASS: 0 hard mismatches, 0 drift (0/10 requests), 0 errors, 0 soft (0.0%)"


def test_any_hard_mismatch_fails_by_default():
    v = evaluate(frame(exact=86, soft=2, hard=24))
    assert (v.passed, v.exit_code) == (False, 1)
    assert v.headline == "FAIL: 24 hard mismatches, 0 drift (24/112 requests), 0 errors, 2 soft (1.8%)"
    assert v.reasons == ["24 hard mismatches > allowed 0"]
    assert (v.requests, v.exact, v.soft, v.hard, v.errors) == (112, 86, 2, 24, 0)


def test_max_hard_threshold():
    assert evaluate(frame(exact=9, hard=1), GateThresholds(max_hard=1)).passed
    assert not evaluate(frame(exact=8, hard=2), GateThresholds(max_hard=1)).passed


def test_soft_rate_exactly_at_the_limit_passes_and_above_fails():
    at = evaluate(frame(exact=49, soft=1))  # 1/50 = 2.0%
    assert (at.passed, at.exit_code) == (True, 0)
    above = evaluate(frame(exact=48, soft=2))  # 4%
    assert (above.passed, above.exit_code) == (False, 1)
    assert above.reasons == ["2 soft flips = 4.00% of 50 requests > allowed 2.00%"]
    assert not evaluate(frame(exact=96, soft=2)).passed  # 2/98 = 2.04%
    assert evaluate(frame(exact=98, soft=2)).passed  # 2/100
    assert not evaluate(frame(exact=97, soft=3)).passed  # 3% > 2%


def test_errors_fail_unless_allowed():
    v = evaluate(frame(exact=5, error=1))
    assert (v.passed, v.exit_code, v.reasons) == (False, 1, ["1 request errors > allowed 0"])
    assert v.headline == "FAIL: 0 hard mismatches, 0 drift (0/6 requests), 1 error, 0 soft (0.0%)"
    assert evaluate(frame(exact=5, error=1), GateThresholds(max_errors=1)).passed


def test_every_failed_check_is_a_reason():
    v = evaluate(frame(exact=1, soft=1, hard=1, error=1))
    assert len(v.reasons) == 3


def test_no_requests_is_a_harness_failure():
    v = evaluate(frame())
    assert (v.passed, v.exit_code) == (False, 2)


def test_thresholds_from_config_and_overrides():
    cfg = {"run_id": "x", "max_hard": 2, "margin_threshold": 0.25, "gate": {"max_hard": 5, "unknown": 1}}
    t = GateThresholds.from_config(cfg)
    assert t == GateThresholds(max_hard=5, max_errors=0, max_soft_rate=0.02, margin_threshold=0.25)
    t = GateThresholds.from_config(cfg, max_hard=None, max_errors=3, max_soft_rate=0.1)
    assert t == GateThresholds(max_hard=5, max_errors=3, max_soft_rate=0.1, margin_threshold=0.25)
    assert GateThresholds.from_config({}) == GateThresholds()


def drift_frame(exact=0, drift=0, hard=0) -> pd.DataFrame:
    return pd.DataFrame({"class": ["exact"] * exact + ["drift"] * drift + ["hard"] * hard})


def test_drift_counts_like_hard_by_default():
    v = evaluate(drift_frame(exact=90, drift=10))
    assert (v.passed, v.exit_code, v.drift, v.hard, v.flagged) == (False, 1, 10, 0, 10)
    assert v.reasons == ["10 requests with log-prob drift (same tokens, drift > 0.001) > allowed 0"]
    windowed = drift_frame(exact=90, drift=10).assign(detail=[None] * 93 + ["prompt log-prob drift 2.1 at ..."] * 7)
    assert evaluate(windowed).reasons == ["10 requests with log-prob drift (same tokens, drift > 0.001; 7 by their "
                                          "prompt past the restored checkpoint, the restore window) > allowed 0"]
    assert v.headline == "FAIL: 0 hard mismatches, 10 drift (10/100 requests), 0 errors, 0 soft (0.0%)"
    assert evaluate(drift_frame(exact=90, drift=10), GateThresholds(max_drift=10)).passed
    both = evaluate(drift_frame(exact=1, drift=2, hard=3))
    assert both.headline == "FAIL: 3 hard mismatches, 2 drift (5/6 requests), 0 errors, 0 soft (0.0%)"
    assert len(both.reasons) == 2


def test_drift_thresholds_from_config():
    t = GateThresholds.from_config({"gate": {"drift_tolerance": "0.05", "max_drift": 2}}, max_drift=None)
    assert (t.drift_tolerance, t.max_drift) == (0.05, 2)
    assert GateThresholds.from_config({}, drift_tolerance=0.2).drift_tolerance == 0.2


def _rate_test(p: float, level: float = 0.0005) -> RateTest:
    return RateTest("controls", "flip", "i128", "c4", "its turns", "ctl-i128-spec + ctl-i128-cache",
                    ExactTest(p, 1e-9, 16, 74, 6, 148), 1, level, 2)


def test_flips_piling_up_fail_the_gate_with_their_own_line():
    v = evaluate(frame(exact=60, soft=14), GateThresholds(max_soft_rate=0.25), rate_tests=[_rate_test(8e-5)])
    assert (v.passed, v.exit_code, v.decided_by_rates) == (False, 1, True)
    assert v.reasons == ["flips pile up: pool i128 at c4: token flips let through as soft, its turns against the "
                         "controls of its path: 16 of 74 (21.6%) vs 6 of 148 (4.1%) of ctl-i128-spec + ctl-i128-cache; "
                         "one-sided exact p = 8e-05 <= 0.001 / 2"]
    assert v.rate_tests[0].as_dict()["significant"] is True
    quiet = evaluate(frame(exact=60, soft=14), GateThresholds(max_soft_rate=0.25), rate_tests=[_rate_test(0.002)])
    assert quiet.passed and quiet.rate_findings == [] and len(quiet.rate_tests) == 1
    both = evaluate(frame(exact=60, soft=13, hard=1), GateThresholds(max_soft_rate=0.25),
                    rate_tests=[_rate_test(8e-5)])
    assert not both.passed and not both.decided_by_rates  # the hard mismatch fails it anyway
