"""The release gate: turn a run's classified requests into a verdict and an exit status.

Exit status: 0 = gate passed, 1 = gate failed (a threshold was exceeded),
2 = the harness itself failed (no records, a crashed run, bad arguments),
3 = inconclusive: no threshold was exceeded, but the run did not exercise what it
gates (reports/exercised.py: no restore, no accepted draft, no verify-step crossing,
boundary-cell coverage below `min_coverage`); a FAIL takes precedence. The
gate never returns 2 for a run that has candidate records; status 2 is set by
`harness.run` and `reports.render` when there is nothing to judge. These constants are the
only definition of the exit statuses.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import pandas as pd

from reports.flip_rates import RateTest
from reports.oracle import DRIFT_TOLERANCE, MARGIN_THRESHOLD
from reports.window import WINDOW_DETAIL

EXIT_PASS = 0
EXIT_GATE_FAILED = 1
EXIT_HARNESS_FAILED = 2
EXIT_INCONCLUSIVE = 3
# The share of (verify step, commit length) boundary cells a full candidate pool must cross and restore: 6 of
# the 36 cells at B=8. The trained drafter decides the commit lengths; the default sweep reaches 11-12 cells per
# interval (docs/reports.md), a single sweep point of the frozen suite restores 13 (I=128, concurrency 4), so
# the default sweep clears it about 2x; --cover reaches all 36.
MIN_COVERAGE = 0.15
# A starting tolerance for external (GPU, bf16) engines, whose batch-dependent numerics move log-probs
# far more than the deterministic built-in engine's; the report's observed noise floor says whether it fits.
EXTERNAL_DRIFT_TOLERANCE = 0.05
_FLOATS = ("max_soft_rate", "margin_threshold", "drift_tolerance", "min_coverage")


@dataclass(frozen=True)
class GateThresholds:
    """What a run may contain and still pass. Soft flips are judged as a share of all candidate requests;
    drift (same tokens, log-probs off by more than `drift_tolerance`) counts like a hard mismatch."""

    max_hard: int = 0
    max_errors: int = 0
    max_soft_rate: float = 0.02
    margin_threshold: float = MARGIN_THRESHOLD  # reference top-1/top-2 margin below which a flip is soft
    max_drift: int = 0
    drift_tolerance: float = DRIFT_TOLERANCE  # largest |candidate - reference| log-prob that is numerics
    min_coverage: float = MIN_COVERAGE  # below this share of boundary cells restored: INCONCLUSIVE

    @classmethod
    def from_mapping(cls, mapping: dict | None, **overrides) -> GateThresholds:
        """Thresholds from a mapping (unknown keys ignored), then the non-None `overrides`."""
        known = {f.name for f in fields(cls)}
        values = {}
        given = {k: v for k, v in overrides.items() if v is not None}
        for name, value in {**(mapping or {}), **given}.items():
            if name in known and value is not None:
                values[name] = float(value) if name in _FLOATS else int(value)
        return cls(**values)

    @classmethod
    def from_config(cls, config: dict | None, **overrides) -> GateThresholds:
        """Thresholds from a run's config.json: top-level keys (harness RunConfig), then its `gate` object."""
        config = config or {}
        gate = config.get("gate") if isinstance(config.get("gate"), dict) else {}
        return cls.from_mapping({**config, **gate}, **overrides)


@dataclass(frozen=True)
class Verdict:
    """The gate's decision with the counts it was made from."""

    passed: bool
    exit_code: int
    reasons: list[str]  # why it failed (empty when it passed)
    requests: int
    exact: int
    soft: int
    hard: int
    errors: int
    thresholds: GateThresholds = field(default_factory=GateThresholds)
    drift: int = 0
    unexercised: list[str] = field(default_factory=list)  # what the run did not exercise, and what to change
    path_numerics: int = 0  # drift judged path numerics (not counted as drift; reports the evidence)
    # every flip-rate test of the run (reports/flip_rates.py), one family; the significant ones are reasons
    rate_tests: tuple[RateTest, ...] = ()

    @property
    def rate_findings(self) -> list[RateTest]:
        """The rate tests that found flips piling up (each a reason)."""
        return [t for t in self.rate_tests if t.significant]

    @property
    def decided_by_rates(self) -> bool:
        """Whether the rate tests alone fail the gate: without them it would have passed (or been
        INCONCLUSIVE)."""
        return bool(self.rate_findings) and len(self.reasons) == len(self.rate_findings)

    @property
    def word(self) -> str:
        """PASS, FAIL or INCONCLUSIVE."""
        if self.passed:
            return "PASS"
        return "INCONCLUSIVE" if self.exit_code == EXIT_INCONCLUSIVE else "FAIL"

    @property
    def soft_rate(self) -> float:
        return self.soft / self.requests if self.requests else 0.0

    @property
    def flagged(self) -> int:
        """Requests that signal a state bug: hard mismatches and drift."""
        return self.hard + self.drift

    @property
    def headline(self) -> str:
        """One line, e.g. `FAIL: 24 hard mismatches, 60 drift (84/112 requests), 0 errors, 2 soft (1.8%)`."""
        word = self.word
        noun = "mismatch" if self.hard == 1 else "mismatches"
        err = "error" if self.errors == 1 else "errors"
        numerics = f", {self.path_numerics} path numerics (not judged)" if self.path_numerics else ""
        return (f"{word}: {self.hard} hard {noun}, {self.drift} drift ({self.flagged}/{self.requests} requests), "
                f"{self.errors} {err}, {self.soft} soft ({100 * self.soft_rate:.1f}%){numerics}")


def evaluate(df: pd.DataFrame, thresholds: GateThresholds | None = None, unexercised: list[str] | None = None,
             path_numerics: int = 0, decisive: list[str] | None = None,
             rate_tests: list[RateTest] | tuple[RateTest, ...] = ()) -> Verdict:
    """Judge the requests frame of `reports.analyze` (one row per gated candidate, column `class`).

    `unexercised`: what the run did not exercise (reports/exercised.py); with no threshold exceeded it makes
    the verdict INCONCLUSIVE (exit 3). `path_numerics`: drift rows already judged path numerics (counted apart).
    `decisive`: per pool, the flips no measured numerics explain (reports/numerics.py), listed after the hard
    count when it fails the gate: evidence of a bug, never a reason for INCONCLUSIVE. `rate_tests`: the run's
    flip-rate tests (reports/flip_rates.py, their family's level set); each significant one fails the gate with its
    own line (both rates, counts, p-value and level)."""
    t = thresholds or GateThresholds()
    counts = df["class"].value_counts() if len(df) else pd.Series(dtype=int)
    exact, drift, soft, hard, errors = (int(counts.get(c, 0)) for c in ("exact", "drift", "soft", "hard", "error"))
    requests = len(df)
    reasons = []
    if requests == 0:
        reasons.append("no candidate requests were recorded: nothing was tested")
    if hard > t.max_hard:
        reasons += [f"{hard} hard mismatches > allowed {t.max_hard}", *(decisive or [])]
    if drift > t.max_drift:
        windowed = int((df["class"].eq("drift") & df["detail"].fillna("").str.startswith(WINDOW_DETAIL)).sum()) \
            if "detail" in df else 0
        how = f"; {windowed} by their prompt past the restored checkpoint, the restore window" if windowed else ""
        reasons.append(f"{drift} requests with log-prob drift (same tokens, drift > {t.drift_tolerance:g}{how}) > "
                       f"allowed {t.max_drift}")
    if errors > t.max_errors:
        reasons.append(f"{errors} request errors > allowed {t.max_errors}")
    # Compare counts, not floats: exactly at the allowed rate passes.
    if requests and soft > t.max_soft_rate * requests + 1e-9:
        reasons.append(f"{soft} soft flips = {100 * soft / requests:.2f}% of {requests} requests "
                       f"> allowed {100 * t.max_soft_rate:.2f}%")
    reasons += [f"flips pile up: {r.text()}" for r in rate_tests if r.significant]
    unexercised = list(unexercised or [])
    passed = not reasons and not unexercised
    if passed:
        code = EXIT_PASS
    elif reasons:
        code = EXIT_HARNESS_FAILED if requests == 0 else EXIT_GATE_FAILED
    else:
        code = EXIT_INCONCLUSIVE
    return Verdict(passed, code, reasons, requests, exact, soft, hard, errors, t, drift, unexercised, path_numerics,
                   tuple(rate_tests))
