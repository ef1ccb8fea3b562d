"""Where the departures the per-turn oracle lets through pile up: flip rates tested, not only single flips.

On a noisy target every low-margin flip is rightly called numerics (soft) one at a time, but a fault that moves a
restored state a little shows as many such flips, not as one large one. So the departures the per-turn oracle let
through are counted per turn and tested, with the exact tests of reports/exact_test.py:

* `flip`: the turn's tokens left the reference and the gate let it through (`soft`, or a flip counted as path
  numerics); `onset`: its log-probs passed the tolerance and the gate let it through (path numerics). Turns the
  gate flagged (drift, hard) or that failed are already judged: the tests weigh the turns it let through.
* **Excess over the controls** (`controls`), per gated pool and sweep point: the pool's flips against every token
  flip of the clean controls that share its path at the same sweep point (or, with --baseline-run, of the trusted
  run's same pool), counted by the calibration (harness/calibrate.py, `flips_by_point`). Numerics flip near-ties
  on both sides alike; a pool that flips more than they do flips for another reason.
* **Concentration where the state was restored**, per gated pool, the sweep points as strata: turns that restored
  a checkpoint against those that restored nothing (`restored`), and turns that restored a checkpoint crossed
  inside a verify step against those that restored one crossed outside any (`verify_crossed`: taken by a
  prefill, or by plain decode in a pool that does not speculate). Needs no control, so it judges endpoints too.

Every test of a run is one family: Tarone's procedure (reports/exact_test.py) sizes it from the tests that can
reach the level at all, and each rejects at p <= ALPHA / K; the family-wise false-alarm rate is at most ALPHA.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import pandas as pd

from records.schema import point_label
from reports.exact_test import ExactTest, Stratum, exact_test, tarone_level
from reports.frame_rows import records
from reports.oracle import FLAGGED

# The family-wise false-alarm rate of all rate tests of one run. A gate runs on every build: at 0.001 a clean build
# fails on them once in a thousand runs, as rarely as the calibrated soft-rate rule's 3 standard deviations
# (one-sided 0.00135) allow; the exact tests hold it at any size, where a normal approximation would not.
ALPHA = 0.001
KINDS = {"controls": "its turns against the controls of its path",
         "restored": "turns that restored a checkpoint against turns that restored nothing",
         "verify_crossed": "restores of a checkpoint crossed inside a verify step against restores of one crossed "
                           "outside any (a prefill's, or plain decode's)"}
EVENTS = {"flip": "token flips let through as soft", "onset": "drift onsets let through as path numerics"}
SPECULATIVE = ("full", "spec_only")


def point_of(row: Mapping) -> str:
    """A row's sweep point label (`c4`, `r2.5`), from its key."""
    return point_label(row) or f"c{row.get('concurrency')}"


def points(df: pd.DataFrame) -> pd.Series:
    """Each row's sweep point label."""
    return pd.Series([point_of(r) for r in records(df, ["key", "pool", "concurrency"])], index=df.index,
                     dtype=object)


def flip_events(df: pd.DataFrame) -> pd.Series:
    """Rows whose tokens left the reference where the gate let it through (soft, or path numerics with a flip)."""
    flipped = df["first_divergence"].notna()
    return (df["class"].eq("soft") | (df["class"].eq("path_numerics") & flipped)).astype(bool)


def onset_events(df: pd.DataFrame) -> pd.Series:
    """Rows whose log-prob drift passed the tolerance where the gate let it through (path numerics)."""
    return (df["class"].eq("path_numerics") & df["drift_onset"].notna()).astype(bool)


def let_through(df: pd.DataFrame) -> pd.DataFrame:
    """The rows the per-turn oracle let through: answered and not flagged (exact, soft, path numerics). Flagged
    and failed turns are already judged; the rate tests weigh what is left."""
    return df[~df["class"].isin(["error", *FLAGGED])] if len(df) else df


def flips_by_point(df: pd.DataFrame) -> dict[str, list[int]]:
    """Per sweep point, [answered turns, turns whose tokens left the reference] of a requests frame (every flip,
    whatever its class: the calibration's controls are clean, so each of their flips is numerics)."""
    answered = df.loc[df["class"] != "error", ["key", "pool", "concurrency", "first_divergence"]] if len(df) else df
    if not len(answered):
        return {}
    flipped = answered["first_divergence"].notna()
    out: dict[str, list[int]] = {}
    for point, g in flipped.groupby(points(answered), sort=True):
        out[str(point)] = [len(g), int(g.sum())]
    return out


def with_control_flips(calibration: Mapping[str, Mapping], df: pd.DataFrame) -> dict[str, Mapping]:
    """`calibration` (config.json `calibration.per_pool`) with `flips_by_point` counted from `df`'s control rows
    where an entry lacks it (a run calibrated before it was recorded). Not for a trusted run's calibration: its
    controls are that run's pools, which `df` does not hold."""
    out = dict(calibration)
    for pool, cal in calibration.items():
        if cal.get("flips_by_point") is None and cal.get("controls") and len(df):
            rows = df.loc[df["pool"].astype(str).isin([str(c) for c in cal["controls"]]),
                          ["key", "pool", "concurrency", "class", "first_divergence"]]
            out[pool] = {**cal, "flips_by_point": flips_by_point(rows) if len(rows) else None}
    return out


@dataclass(frozen=True)
class RateTest:
    """One rate test: the events of group a (under test) against group b, its exact p-value, and the level the
    run's family gave it (None until family_of sizes the family)."""

    kind: str  # a KINDS key
    event: str  # an EVENTS key
    pool: str
    point: str | None  # the sweep point (`controls`), None: the pool's sweep points as strata
    group: str  # group a (under test), e.g. `restored a checkpoint`
    base: str  # group b (the comparison), e.g. `restored nothing`, `ctl-i128-spec + ctl-i128-cache`
    test: ExactTest
    strata: int = 1
    level: float | None = None  # ALPHA / K, Tarone's K (the family's size)
    family: int | None = None  # K

    @property
    def testable(self) -> bool:
        """Whether these margins can give a p-value at the level at all (Tarone: else not counted in K)."""
        return self.level is not None and self.test.p_min <= self.level

    @property
    def significant(self) -> bool:
        return self.level is not None and self.test.p <= self.level

    def text(self) -> str:
        """One line, e.g. `pool i128 at c4: token flips let through as soft, its turns against the controls of its
        path: 16 of 74 (21.6%) vs 6 of 148 (4.1%) of ctl-i128-spec + ctl-i128-cache (every token flip); one-sided
        exact p = 8.1e-05 <= 0.001 / 2`."""
        t = self.test

        def share(e: int, n: int) -> str:
            return f"{e} of {n} ({100 * e / n:.1f}%)" if n else "0 of 0"

        where = f"pool {self.pool}" + (f" at {self.point}" if self.point else
                                      f" ({self.strata} sweep points as strata)" if self.strata > 1 else "")
        level = f" {'<=' if self.significant else '>'} {ALPHA:g} / {self.family}" if self.level is not None else ""
        return (f"{where}: {EVENTS[self.event]}, {KINDS[self.kind]}: {share(t.events_a, t.turns_a)} vs "
                f"{share(t.events_b, t.turns_b)}{f' of {self.base}' if self.kind == 'controls' else ''}; one-sided "
                f"exact p = {t.p:.2g}{level}")

    def as_dict(self) -> dict:
        """The test as the renderers read it (Verdict.rate_tests; docs/reports.md)."""
        t = self.test
        return {"kind": self.kind, "event": self.event, "pool": self.pool, "point": self.point,
                "group": self.group, "events": t.events_a, "turns": t.turns_a, "base": self.base,
                "base_events": t.events_b, "base_turns": t.turns_b, "strata": self.strata, "p": t.p,
                "p_min": t.p_min, "level": self.level, "family": self.family, "significant": self.significant,
                "text": self.text()}


def control_tests(gated: pd.DataFrame, calibration: Mapping[str, Mapping], trusted: str | None = None
                  ) -> list[RateTest]:
    """Per gated pool and sweep point: its flips against its controls' (config.json `calibration.per_pool`:
    `controls`, and `flips_by_point`, their [answered, flipped] per sweep point; `trusted`: the trusted run they
    come from, with --baseline-run); and, where the pool has more than one such sweep point, the pool over all of
    them as strata (an excess spread thinly over the sweep points adds up there). Pools without a calibration, and
    sweep points the controls did not serve, are not tested."""
    out: list[RateTest] = []
    answered = let_through(gated)
    if not len(answered):
        return out
    events, point = flip_events(answered), points(answered)
    strata: dict[str, list[Stratum]] = {}
    for (pool, pt), idx in answered.groupby([answered["pool"].astype(str), point], sort=True).groups.items():
        cal = calibration.get(pool) or {}
        base = (cal.get("flips_by_point") or {}).get(pt)
        if not base or not base[0]:
            continue
        stratum = Stratum(int(events[idx].sum()), len(idx), int(base[1]), int(base[0]))
        strata.setdefault(pool, []).append(stratum)
        out.append(RateTest("controls", "flip", pool, str(pt), "its turns", _controls(cal, trusted),
                            exact_test([stratum])))
    for pool, s in strata.items():
        if len(s) > 1:
            out.append(RateTest("controls", "flip", pool, None, "its turns", _controls(calibration[pool], trusted),
                                exact_test(s), len(s)))
    return out


def _controls(cal: Mapping, trusted: str | None) -> str:
    """What a pool is compared with, e.g. `ctl-i128-spec + ctl-i128-cache (every token flip)`."""
    controls = " + ".join(cal.get("controls") or ())
    return f"the trusted run's {controls} (every token flip)" if trusted else f"{controls} (every token flip)"


def _restore_groups(g: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """(restored a checkpoint crossed inside a verify step, restored one crossed outside any) of a pool's rows.
    Inside: the previous turn's reported verify step crossed it, or (no verify steps reported) it lies in the
    previous turn's generated positions of a speculative pool, all decoded by verify steps. Outside: the previous
    turn's prefill took it, or plain decode crossed it (positions of a pool that does not speculate). A checkpoint
    another session left, or whose taking turn failed, is in neither."""
    link = g["restored_link"].astype(object)
    speculative = g["variant"].isin(SPECULATIVE)
    inside = g["restored_verify_crossed"].fillna(False).astype(bool) | (link.eq("position") & speculative)
    outside = link.eq("prefill") | (link.eq("position") & ~speculative)
    return inside & g["restored"], outside & g["restored"] & ~inside


def _stratified(events: pd.Series, a: pd.Series, b: pd.Series, point: pd.Series) -> tuple[ExactTest, int]:
    """The exact test of `events` in rows `a` against rows `b`, one stratum per sweep point either holds."""
    strata = []
    for pt in sorted(set(point[a | b])):
        at = point.eq(pt)
        strata.append(Stratum(int((events & a & at).sum()), int((a & at).sum()), int((events & b & at).sum()),
                              int((b & at).sum())))
    return exact_test(strata), len(strata)


def concentration_tests(gated: pd.DataFrame) -> list[RateTest]:
    """Per gated pool, for both events: restored turns against turns that restored nothing, and restores of a
    verify-crossed checkpoint against restores of one crossed outside any verify step; sweep points as strata.
    A comparison with no turn on one side is not tested."""
    out: list[RateTest] = []
    answered = let_through(gated)
    if not len(answered):
        return out
    for pool, g in answered.groupby(answered["pool"].astype(str), sort=True):
        point = points(g)
        restored = g["restored"].astype(bool)
        inside, outside = _restore_groups(g)
        pairs = [("restored", restored, ~restored, "restored a checkpoint", "restored nothing"),
                 ("verify_crossed", inside, outside, "restored a verify-crossed checkpoint",
                  "restored one crossed outside a verify step")]
        for kind, a, b, group, base in pairs:
            if not a.any() or not b.any():
                continue
            for event, hit in (("flip", flip_events(g)), ("onset", onset_events(g))):
                test, strata = _stratified(hit, a, b, point)
                out.append(RateTest(kind, event, str(pool), None, group, base, test, strata))
    return out


WHERE = {"verify_crossed": ("in turns that restored a checkpoint crossed inside a verify step, more than in restores "
                            "of one crossed outside any", "the speculation x cache interplay: checkpoint tracking in "
                            "verify steps, the #37817 class"),
         "restored": ("in turns that restored a checkpoint, more than in turns that restored nothing",
                      "the restored checkpoints: caching / checkpoint tracking, or the speculation x cache interplay"),
         "controls": ("more than in the clean controls of the pool's paths",
                      "its own combination of speculation and caching, which neither control runs")}


def where_rates_point(findings: list[RateTest] | tuple[RateTest, ...]) -> str:
    """Where significant rate tests point, the most specific first (verify-crossed restores, restores, the pool's
    paths), e.g. `in turns that restored a checkpoint, more than in turns that restored nothing, in pool(s) i128
    (the restored checkpoints: ...)`."""
    parts = []
    for kind, (what, why) in WHERE.items():
        pools = sorted({t.pool for t in findings if t.kind == kind})
        if pools:
            parts.append(f"{what}, in pool(s) {', '.join(pools)} ({why})")
    return "; ".join(parts)


def family_text(tests: list[RateTest] | tuple[RateTest, ...]) -> str:
    """One sentence on a run's rate tests: how many, the family's level, how many found flips piling up, the
    smallest p-value seen."""
    if not tests:
        return "no flip-rate test could be made (no control flips per sweep point, no restored turns beside others)"
    first = min(tests, key=lambda t: t.test.p)
    found = sum(t.significant for t in tests)
    return (f"{len(tests)} exact test(s) at a family-wise level of {ALPHA:g}: {first.family} of them can reach "
            f"it (Tarone), so each is held to {ALPHA:g} / {first.family} = {first.level:.2g}; "
            + (f"{found} found flips piling up" if found else "none found flips piling up")
            + f"; the smallest p-value is {first.test.p:.2g} ({first.text()})")


def rates_table(tests: list[RateTest] | tuple[RateTest, ...]) -> pd.DataFrame:
    """The tests that can reach the level, side by side, smallest p first: pool, sweep point, what is compared,
    both groups' events and turns, p, level."""
    rows = [{"pool": t.pool, "point": t.point or f"{t.strata} as strata", "test": t.kind, "event": t.event,
             "group": t.group, "rate": f"{t.test.events_a}/{t.test.turns_a}", "against": t.base.split(" (")[0],
             "its rate": f"{t.test.events_b}/{t.test.turns_b}", "p": t.test.p, "level": t.level,
             "found": "yes" if t.significant else ""}
            for t in sorted(tests, key=lambda t: t.test.p) if t.testable]
    return pd.DataFrame(rows, columns=["pool", "point", "test", "event", "group", "rate", "against", "its rate", "p",
                                       "level", "found"])


def family_of(tests: list[RateTest]) -> list[RateTest]:
    """The run's tests with the level Tarone's procedure gives the family at ALPHA (reports/exact_test.py)."""
    if not tests:
        return []
    level, k = tarone_level([t.test.p_min for t in tests], ALPHA)
    return [replace(t, level=level, family=k) for t in tests]


def rate_tests(gated: pd.DataFrame, calibration: Mapping[str, Mapping] | None, trusted: str | None = None
               ) -> list[RateTest]:
    """Every rate test of a run's gated pools (as judged: classes after path numerics), as one family;
    `calibration` and `trusted` as control_tests takes them."""
    return family_of(control_tests(gated, calibration or {}, trusted) + concentration_tests(gated))
