"""reports/exact_test.py: exact one-sided p-values on small tables (against hand-counted fractions and a brute force
over every assignment of turns), the smallest p-value a table's margins allow, the level under the null, and
Tarone's family size."""

import itertools
import random
from fractions import Fraction
from math import comb

import pytest

from reports import exact_test as exact_test_module
from reports.exact_test import Stratum, exact_test, fisher_greater, tarone_level


def test_fishers_tea_tasting_table():
    # 4 cups of each kind, 3 of 4 told right: P(X >= 3) = (16 + 1) / 70
    assert fisher_greater(3, 4, 1, 4) == pytest.approx(17 / 70, rel=1e-15)
    assert fisher_greater(4, 4, 0, 4) == pytest.approx(1 / 70, rel=1e-15)
    assert fisher_greater(0, 4, 4, 4) == 1.0


def test_the_dieting_table():
    # 12 women, 9 dieting; 12 men, 1 dieting: P(X >= 9), X ~ Hypergeom(N=24, K=10, n=12) = (10 C(14,3) + C(14,2)) /
    # C(24,12) = 3731 / 2704156; the observed table alone is 3640 / 2704156 = 0.001346 (Fisher's exact test, as
    # textbooks give it)
    assert fisher_greater(9, 12, 1, 12) == pytest.approx(3731 / 2704156, rel=1e-15)


def test_the_issues_rates():
    # 16 of 74 soft flips against the controls' 6 of 148; 7 of 74 (a clean bf16 candidate, seed 2) against the same
    exact = Fraction(sum(comb(22, x) * comb(200, 74 - x) for x in range(16, 23)), comb(222, 74))
    assert fisher_greater(16, 74, 6, 148) == pytest.approx(float(exact), rel=1e-15)
    assert fisher_greater(16, 74, 6, 148) < 1e-4 < 0.05 < fisher_greater(7, 74, 6, 148)


def brute_force(strata: list[Stratum]) -> tuple[Fraction, Fraction]:
    """(P(summed events of a >= seen), P(the most extreme sum)) by enumerating which turns of each stratum form
    group a, every assignment equally likely: no formula shared with the module."""
    per = []
    for s in strata:
        turns = [1] * (s.events_a + s.events_b) + [0] * (s.turns_a + s.turns_b - s.events_a - s.events_b)
        counts: dict[int, int] = {}
        for chosen in itertools.combinations(range(len(turns)), s.turns_a):
            e = sum(turns[i] for i in chosen)
            counts[e] = counts.get(e, 0) + 1
        per.append(counts)
    total = Fraction(1)
    for counts in per:
        total *= sum(counts.values())
    joint = {0: 1}
    for counts in per:
        nxt: dict[int, int] = {}
        for t, w in joint.items():
            for e, c in counts.items():
                nxt[t + e] = nxt.get(t + e, 0) + w * c
        joint = nxt
    seen = sum(s.events_a for s in strata)
    return (Fraction(sum(w for t, w in joint.items() if t >= seen)) / total,
            Fraction(joint[max(joint)]) / total)


@pytest.mark.parametrize("seed", range(40))
def test_stratified_p_values_equal_the_brute_force(seed):
    rng = random.Random(seed)
    strata = []
    for _ in range(rng.randint(1, 3)):
        turns_a, turns_b = rng.randint(0, 6), rng.randint(0, 6)
        strata.append(Stratum(rng.randint(0, turns_a), turns_a, rng.randint(0, turns_b), turns_b))
    p, p_min = brute_force(strata)
    t = exact_test(strata)
    assert t.p == pytest.approx(float(p), rel=1e-12) and t.p_min == pytest.approx(float(p_min), rel=1e-12)
    assert (t.events_a, t.turns_a) == (sum(s.events_a for s in strata), sum(s.turns_a for s in strata))


def test_two_strata_of_the_tea_table():
    # per stratum the counts 0..4 have weights 1, 16, 36, 16, 1 of 70; the sum >= 6: 2 x 36 + 16 x 16 + 2 x 16 + 1
    t = exact_test([Stratum(3, 4, 1, 4), Stratum(3, 4, 1, 4)])
    assert t.p == pytest.approx(361 / 4900, rel=1e-15) and t.p_min == pytest.approx(1 / 4900, rel=1e-15)


def test_strata_without_information_change_nothing():
    base = exact_test([Stratum(5, 20, 1, 20)])
    same = exact_test([Stratum(5, 20, 1, 20), Stratum(0, 7, 0, 9), Stratum(3, 3, 0, 0), Stratum(0, 0, 2, 5)])
    assert same.p == base.p and same.p_min == base.p_min


def test_the_smallest_p_value_a_table_allows():
    # 3 events among 74 turns, 37 in a: at best all 3 in a, C(37,3) / C(74,3)
    assert exact_test([Stratum(0, 37, 3, 37)]).p_min == pytest.approx(comb(37, 3) / comb(74, 3), rel=1e-15)
    assert exact_test([Stratum(0, 37, 0, 37)]).p_min == 1.0  # no event: nothing to test


def test_the_tests_level_holds_under_the_null():
    """Both groups draw events at one rate: the test rejects at alpha no more often than alpha (it is exact, and
    conservative for counts)."""
    rng = random.Random(7)
    for rate, alpha in ((0.06, 0.05), (0.2, 0.01)):
        draws = 3000
        rejected = 0
        for _ in range(draws):
            a = sum(rng.random() < rate for _ in range(74))
            b = sum(rng.random() < rate for _ in range(148))
            rejected += fisher_greater(a, 74, b, 148) <= alpha
        assert rejected / draws <= alpha * 1.25  # binomial spread of the estimate over 3000 draws


def test_tarone_counts_only_the_tests_that_can_reach_the_level():
    # 10 tests: 2 can reach any level, 8 can never reach 0.001 / 2: K = 2
    assert tarone_level([1e-9, 1e-9] + [0.1] * 8, 0.001) == (0.0005, 2)
    # every test can reach it: plain Bonferroni
    assert tarone_level([1e-9] * 4, 0.001) == (0.00025, 4)
    # 3 tests reach 0.001 / 1 and 0.001 / 2 but only 1 reaches 0.001 / 3: K = 3 (at most 3 can reach 0.001 / 3)
    assert tarone_level([1e-9, 4e-4, 4e-4], 0.001) == pytest.approx((0.001 / 3, 3))
    assert tarone_level([], 0.001) == (0.001, 1)


@pytest.mark.parametrize("seed", range(12))
def test_the_float_law_of_large_strata_equals_the_integer_one(seed, monkeypatch):
    """Strata past EXACT_TURNS are tested in floating point: the same p-values as integer arithmetic gives, from
    tables of a few turns to several hundred, one stratum or several, whatever side the events lean to."""
    rng = random.Random(seed)
    strata = []
    for _ in range(rng.randint(1, 4)):
        turns_a, turns_b = rng.randint(1, 300), rng.randint(1, 600)
        rate = rng.choice([0.001, 0.02, 0.3])
        strata.append(Stratum(sum(rng.random() < rate * rng.choice([1, 3]) for _ in range(turns_a)), turns_a,
                              sum(rng.random() < rate for _ in range(turns_b)), turns_b))
    exact = exact_test(strata)
    monkeypatch.setattr(exact_test_module, "EXACT_TURNS", 0)
    approx = exact_test(strata)
    if exact.p > 1e-60:  # far below any level, the float law keeps fewer digits (reports/exact_test.py _TRIM)
        assert approx.p == pytest.approx(exact.p, rel=1e-9)
    else:
        assert approx.p < 1e-50
    assert approx.p_min == pytest.approx(exact.p_min, rel=1e-9, abs=1e-300)
    assert (approx.events_a, approx.turns_a, approx.events_b, approx.turns_b) == \
        (exact.events_a, exact.turns_a, exact.events_b, exact.turns_b)


def test_a_soak_sized_table_is_tested_in_floating_point():
    """Tens of thousands of turns per stratum: a clear excess is found, no excess is not (the float law)."""
    big = [Stratum(400, 30_000, 300, 60_000), Stratum(380, 30_000, 310, 60_000)]
    assert exact_test(big).p < 1e-30
    same = [Stratum(100, 30_000, 200, 60_000), Stratum(90, 30_000, 205, 60_000)]
    assert exact_test(same).p > 0.5
