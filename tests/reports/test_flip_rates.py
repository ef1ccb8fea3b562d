"""reports/flip_rates.py: which turns carry an event, which groups each test compares, the counts and exact p-values
it reports, and the family's level (Tarone) that decides which of them fail the gate."""

from math import comb

import pandas as pd
import pytest

from reports.exact_test import fisher_greater
from reports.flip_rates import (
    ALPHA,
    concentration_tests,
    control_tests,
    family_of,
    flip_events,
    flips_by_point,
    onset_events,
    rate_tests,
    with_control_flips,
)


def turn(pool: str, point: str, n: int, cls: str = "exact", *, restored: bool = False, link: str | None = None,
         variant: str = "full", onset: int | None = None, flip_at: int | None = None) -> dict:
    """One row of a requests frame, as reports.analyze gives it (the columns the rate tests read)."""
    flipped = cls in ("soft", "hard") or flip_at is not None
    return {"key": f"{pool}-{point}/s{n}/{int(restored)}", "pool": pool, "concurrency": int(point[1:]),
            "class": cls, "variant": variant, "first_divergence": (flip_at if flip_at is not None else 3)
            if flipped else None, "drift_onset": onset, "restored": restored,
            "restored_verify_crossed": link == "verify", "restored_link": link}


def frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows).astype({"first_divergence": "Int64", "drift_onset": "Int64"})


def pool_rows(pool: str, point: str, *, verify: tuple[int, int] = (0, 0), prefill: tuple[int, int] = (0, 0),
              unrestored: tuple[int, int] = (0, 0), variant: str = "full") -> list[dict]:
    """(soft flips, turns) of each group of one pool at one sweep point."""
    rows = []
    for (soft, n), restored, link in ((verify, True, "verify"), (prefill, True, "prefill"), (unrestored, False, None)):
        for i in range(n):
            rows.append(turn(pool, point, len(rows), "soft" if i < soft else "exact", restored=restored, link=link,
                             variant=variant))
    return rows


def test_events_are_the_departures_the_gate_let_through():
    df = frame([turn("i128", "c4", 0, "soft"), turn("i128", "c4", 1, "hard"), turn("i128", "c4", 2, "drift", onset=0),
                turn("i128", "c4", 3, "path_numerics", onset=0), turn("i128", "c4", 4, "path_numerics", onset=0,
                                                                       flip_at=5),
                turn("i128", "c4", 5, "exact"), turn("i128", "c4", 6, "error")])
    assert list(flip_events(df)) == [True, False, False, False, True, False, False]
    assert list(onset_events(df)) == [False, False, False, True, True, False, False]


def test_turns_the_gate_flagged_or_that_failed_are_weighed_by_no_test():
    rows = pool_rows("i128", "c4", verify=(3, 10), unrestored=(1, 10))
    rows += [turn("i128", "c4", 50 + i, cls, restored=True, link="verify") for i, cls in
             enumerate(["hard", "drift", "error"])]
    t = next(t for t in concentration_tests(frame(rows)) if (t.kind, t.event) == ("restored", "flip"))
    assert (t.test.events_a, t.test.turns_a, t.test.events_b, t.test.turns_b) == (3, 10, 1, 10)
    cal = {"i128": {"controls": ["ctl-i128-spec"], "flips_by_point": {"c4": [20, 1]}}}
    assert control_tests(frame(rows), cal)[0].test.turns_a == 20


def test_controls_flips_count_every_flip_per_sweep_point():
    df = frame([turn("ctl-i128-spec", "c4", 0, "soft"), turn("ctl-i128-spec", "c4", 1, "hard"),
                turn("ctl-i128-spec", "c4", 2), turn("ctl-i128-spec", "c8", 3, "error"),
                turn("ctl-i128-cache", "c8", 4, "soft")])
    assert flips_by_point(df) == {"c4": [3, 2], "c8": [1, 1]}
    cal = with_control_flips({"i128": {"controls": ["ctl-i128-spec"]}, "i256": {"controls": ["ctl-i256-spec"],
                                                                             "flips_by_point": {"c4": [5, 1]}}}, df)
    assert cal["i128"]["flips_by_point"] == {"c4": [3, 2]} and cal["i256"]["flips_by_point"] == {"c4": [5, 1]}


def test_a_pool_is_tested_against_its_controls_at_each_sweep_point():
    df = frame(pool_rows("i128", "c4", verify=(12, 30), unrestored=(4, 44))
               + pool_rows("i128", "c8", unrestored=(1, 10)))
    cal = {"i128": {"controls": ["ctl-i128-spec", "ctl-i128-cache"], "flips_by_point": {"c4": [148, 6]}}}
    tests = control_tests(df, cal)
    assert len(tests) == 1  # c8: the controls did not serve it
    t = tests[0]
    assert (t.kind, t.pool, t.point) == ("controls", "i128", "c4")
    assert (t.test.events_a, t.test.turns_a, t.test.events_b, t.test.turns_b) == (16, 74, 6, 148)
    assert t.test.p == fisher_greater(16, 74, 6, 148)
    trusted = control_tests(df, {"i128": {"controls": ["i128"], "flips_by_point": {"c4": [74, 3]}}}, "runs/trusted")
    assert "vs 3 of 74 (4.1%) of the trusted run's i128 (every token flip)" in family_of(trusted)[0].text()


def test_restored_turns_against_those_that_restored_nothing_with_sweep_points_as_strata():
    df = frame(pool_rows("i128", "c4", verify=(6, 10), prefill=(0, 4), unrestored=(1, 14))
               + pool_rows("i128", "c8", verify=(2, 6), unrestored=(0, 6)))
    tests = {(t.kind, t.event): t for t in concentration_tests(df)}
    restored = tests[("restored", "flip")]
    assert (restored.test.events_a, restored.test.turns_a, restored.test.events_b, restored.test.turns_b) == \
        (8, 20, 1, 20)
    assert restored.strata == 2
    # the stratified law: c4 has 7 events among 28 turns (14 restored), c8 2 among 12 (6 restored)
    w4 = [comb(7, x) * comb(21, 14 - x) for x in range(8)]
    w8 = [comb(2, x) * comb(10, 6 - x) for x in range(3)]
    upper = sum(w4[x] * w8[y] for x in range(8) for y in range(3) if x + y >= 8)
    assert restored.test.p == pytest.approx(upper / (comb(28, 14) * comb(12, 6)), rel=1e-12)
    crossed = tests[("verify_crossed", "flip")]  # c8 has no restore outside a verify step: one side only there
    assert (crossed.test.events_a, crossed.test.turns_a, crossed.test.events_b, crossed.test.turns_b) == (8, 16, 0, 4)
    # c4 alone carries information: all 6 events among its 14 restores fell in the 10 verify-crossed ones
    assert crossed.test.p == pytest.approx(comb(8, 4) / comb(14, 10), rel=1e-12)
    assert tests[("restored", "onset")].test.p == 1.0  # no path numerics anywhere


def test_a_pool_that_restored_nothing_or_has_one_kind_of_restore_is_not_compared():
    df = frame(pool_rows("i128-spec", "c4", unrestored=(3, 20), variant="spec_only")
               + pool_rows("i256", "c4", verify=(3, 10), unrestored=(1, 10)))
    kinds = {(t.pool, t.kind) for t in concentration_tests(df)}
    assert kinds == {("i256", "restored")}


def test_position_linked_restores_are_verify_crossed_only_in_a_pool_that_speculates():
    rows = [turn("i128", "c4", i, restored=True, link="position") for i in range(3)]
    rows += [turn("i128-cache", "c4", i, restored=True, link="position", variant="cache_only") for i in range(3)]
    rows += [turn("i128-cache", "c4", 9, restored=True, link="prefill", variant="cache_only"),
             turn("i128", "c4", 9, restored=True, link="none")]
    tests = {(t.pool, t.kind, t.event): t for t in concentration_tests(frame(rows))}
    assert ("i128", "verify_crossed", "flip") not in tests  # 3 position-linked, none outside: one side only
    assert ("i128-cache", "verify_crossed", "flip") not in tests  # plain decode's: outside, none inside


def test_the_family_level_and_which_tests_fail_the_gate():
    df = frame(pool_rows("i128", "c4", verify=(14, 30), unrestored=(2, 44)))
    cal = {"i128": {"controls": ["ctl-i128-spec", "ctl-i128-cache"], "flips_by_point": {"c4": [148, 6]}}}
    tests = rate_tests(df, cal)
    # 3 tests (no restore outside a verify step: that comparison is not made); 2 can reach 0.001 / 2, the
    # restored turns' onsets have no event at all
    assert len(tests) == 3 and {t.family for t in tests} == {2}
    assert all(t.level == pytest.approx(ALPHA / 2) for t in tests)
    found = [t for t in tests if t.significant]
    assert {(t.kind, t.event) for t in found} == {("controls", "flip"), ("restored", "flip")}
    controls = next(t for t in found if t.kind == "controls")
    assert controls.text() == (
        "pool i128 at c4: token flips let through as soft, its turns against the controls of its path: 16 of 74 "
        f"(21.6%) vs 6 of 148 (4.1%) of ctl-i128-spec + ctl-i128-cache (every token flip); one-sided exact p = "
        f"{fisher_greater(16, 74, 6, 148):.2g} <= 0.001 / 2")
    d = controls.as_dict()
    assert (d["events"], d["turns"], d["base_events"], d["base_turns"], d["significant"]) == (16, 74, 6, 148, True)
    assert d["level"] == pytest.approx(ALPHA / 2) and d["text"] == controls.text()


def test_a_clean_pool_raises_nothing():
    df = frame(pool_rows("i128", "c4", verify=(2, 30), prefill=(0, 3), unrestored=(3, 41)))
    tests = rate_tests(df, {"i128": {"controls": ["ctl-i128-spec"], "flips_by_point": {"c4": [74, 4]}}})
    assert tests and not any(t.significant for t in tests)
    assert min(t.test.p for t in tests) > 0.3


def test_a_pool_over_its_sweep_points_as_strata_adds_up_an_excess_spread_thinly():
    rows = []
    for point in ("c1", "c4", "c8", "c16"):
        rows += pool_rows("i128", point, unrestored=(9, 74))
    cal = {"i128": {"controls": ["ctl-i128-spec", "ctl-i128-cache"],
                    "flips_by_point": {p: [148, 6] for p in ("c1", "c4", "c8", "c16")}}}
    tests = control_tests(frame(rows), cal)
    per_point = [t for t in tests if t.point]
    pooled = next(t for t in tests if t.point is None)
    assert len(per_point) == 4 and all(t.test.p == fisher_greater(9, 74, 6, 148) for t in per_point)
    assert (pooled.strata, pooled.test.events_a, pooled.test.turns_a) == (4, 36, 296)
    assert pooled.test.p < 0.001 / 5 < min(t.test.p for t in per_point)  # 12% against 4%: only the pool sees it
    assert "pool i128 (4 sweep points as strata): " in pooled.text()


def test_the_first_screen_shows_the_findings_rates_side_by_side():
    from reports.html_where import rates_part

    df = frame(pool_rows("i128", "c4", verify=(14, 30), unrestored=(2, 44)))
    cal = {"i128": {"controls": ["ctl-i128-spec", "ctl-i128-cache"], "flips_by_point": {"c4": [148, 6]}}}
    found = [t for t in rate_tests(df, cal) if t.significant]
    part = rates_part(found)
    assert part.count('<tr class="hot">') == len(found) == 2
    assert "i128 at c4" in part and "16 of 74 (21.6%)" in part and "6 of 148 (4.1%)" in part
    assert "restored nothing" in part and rates_part([]) == ""
