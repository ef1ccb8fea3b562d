"""What the evidence points at: the noise floor beside the drift tolerance, and the subsystem under suspicion.

The noise floor is the drift of requests that restored nothing (`cached_tokens == 0`):
what the engine's numerics alone do to the log-probs. The differential diagnosis
(DESIGN.md 3.3) compares, per interval, the full candidate (speculation + radix cache)
with the `--diagnose` pools: speculation only (radix off) and cache only (no
speculation): only the full pool flagged means the interplay (the #37817 class).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from reports.oracle import FLAGGED

FLOOR_MARGIN = 10.0  # warn when the observed floor comes within this factor of the tolerance
VARIANTS = ("full", "spec_only", "cache_only")

SUBSYSTEMS = {
    "interplay": "the speculation x cache interplay (the #37817 class): only the full candidate (speculation + "
                 "radix cache) is flagged; speculation alone and caching alone are clean",
    "caching": "caching / checkpoint tracking: the cache-only pool (no speculation) is flagged too",
    "speculation": "speculative verify / accept: the speculation-only pool (no radix cache) is flagged too",
    "both": "both speculation and caching: the speculation-only and the cache-only pools are flagged",
    "none": "no subsystem: no request was flagged in any pool",
}


@dataclass(frozen=True)
class NoiseFloor:
    """The drift distribution of requests that restored nothing, beside the tolerance."""

    tolerance: float
    requests: int  # requests that restored nothing and have a measured drift
    max: float | None
    p50: float | None
    p99: float | None
    unmeasured: int  # answered requests classified by the margin rule only (no log-probs)

    @property
    def too_close(self) -> bool:
        """True when the floor's maximum is within FLOOR_MARGIN x of the tolerance."""
        return self.max is not None and self.max * FLOOR_MARGIN >= self.tolerance

    def warnings(self) -> list[str]:
        """What the reader must be told about the oracle's footing."""
        out = []
        if self.too_close:
            out.append(f"the observed noise floor (max drift {self.max:.3g} over {self.requests} requests that "
                       f"restored nothing) is within {FLOOR_MARGIN:g}x of the drift tolerance "
                       f"{self.tolerance:g}: numerics may be flagged as drift (raise --drift-tolerance), or a bug "
                       "outside the cache moves log-probs (see the diagnosis)")
        if self.unmeasured:
            out.append(f"{self.unmeasured} request(s) without log-probs on both sides: classified by the "
                       "margin rule only (drift not measured)")
        return out


def noise_floor(df: pd.DataFrame, tolerance: float) -> NoiseFloor:
    """The observed floor of a requests frame."""
    answered = df[df["class"] != "error"] if len(df) else df
    unmeasured = int((answered["oracle"] == "margin").sum()) if len(answered) else 0
    cold = answered[(answered["cached_tokens"] == 0) & answered["drift"].notna()] if len(answered) else answered
    if not len(cold):
        return NoiseFloor(tolerance, 0, None, None, None, unmeasured)
    d = cold["drift"].astype(float).to_numpy()
    return NoiseFloor(tolerance, len(d), float(d.max()), float(np.percentile(d, 50)), float(np.percentile(d, 99)),
                      unmeasured)


@dataclass(frozen=True)
class Diagnosis:
    """The subsystem the evidence points at (a SUBSYSTEMS key, `mixed`, or `undiagnosed`) and why."""

    subsystem: str
    headline: str
    evidence: list[str] = field(default_factory=list)
    table: pd.DataFrame | None = None  # per interval and variant: requests, flagged


def _flagged_table(df: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (interval, variant), g in df.groupby(["interval", "variant"], sort=True):
        rows.append({"interval": int(interval), "variant": variant, "requests": len(g),
                     "flagged": int(g["class"].isin(FLAGGED).sum()), "hard": int((g["class"] == "hard").sum()),
                     "drift": int((g["class"] == "drift").sum())})
    return pd.DataFrame(rows, columns=["interval", "variant", "requests", "flagged", "hard", "drift"])


def interval_subsystem(flagged: dict[str, int]) -> str:
    """The rule for one interval, from flagged counts per variant (all three present)."""
    spec, cache = flagged.get("spec_only", 0) > 0, flagged.get("cache_only", 0) > 0
    if spec and cache:
        return "both"
    if cache:
        return "caching"
    if spec:
        return "speculation"
    return "interplay" if flagged.get("full", 0) > 0 else "none"


def _undiagnosed(df: pd.DataFrame) -> Diagnosis:
    flagged = df[df["class"].isin(FLAGGED)]
    if not len(flagged):
        return Diagnosis("none", "Nothing points at a subsystem: no request was flagged (drift or hard).")
    at_restore = flagged[flagged["onset_points_at"] == "restored_checkpoint"]
    verify = at_restore[at_restore["restored_verify_crossed"]]
    position = at_restore[at_restore["restored_link"] == "position"]
    linked = f"{len(verify)} of those restored a checkpoint that the previous turn crossed inside a verify step"
    if len(position):  # the engine reports no verify steps: the link is by position, the step unknown
        linked = (f"{len(position)} of those restored a checkpoint the previous turn crossed (position-linked; "
                  "whether inside a verify step: unknown, the engine does not report verify steps)")
    evidence = [f"{len(flagged)} flagged request(s); {len(at_restore)} of them restored a checkpoint and left the "
                f"reference from their first output token, {linked}",
                "run with --diagnose to add speculation-only and cache-only pools and tell speculation, caching "
                "and their interplay apart"]
    if len(at_restore) == len(flagged):
        headline = ("The evidence points at the restored checkpoints (caching / checkpoint tracking, or the "
                    "speculation x cache interplay); --diagnose would tell which.")
    else:
        headline = (f"{len(flagged) - len(at_restore)} flagged request(s) did not start at a restored checkpoint: "
                    "not only the cache is implicated; --diagnose would tell which subsystem.")
    return Diagnosis("undiagnosed", headline, evidence, _flagged_table(df))


def diagnose(df: pd.DataFrame) -> Diagnosis:
    """Name the subsystem from the --diagnose pools (per interval), or say what the attribution suggests."""
    if not len(df) or not {"spec_only", "cache_only"} <= set(df["variant"].dropna()):
        return _undiagnosed(df) if len(df) else Diagnosis("none", "No candidate requests.")
    table = _flagged_table(df.dropna(subset=["interval"]))
    per = {}
    for interval, g in table.groupby("interval", sort=True):
        per[int(interval)] = interval_subsystem(dict(zip(g["variant"], g["flagged"], strict=True)))
    evidence = []
    for interval, g in table.groupby("interval", sort=True):
        counts = ", ".join(f"{v} {int(r['flagged'])}/{int(r['requests'])}" for v in VARIANTS
                           for r in g[g["variant"] == v].to_dict("records"))
        evidence.append(f"interval {interval}: flagged {counts} -> {per[int(interval)]}")
    found = set(per.values())
    if len(found) == 1:
        subsystem = found.pop()
        return Diagnosis(subsystem, f"The evidence points at {SUBSYSTEMS[subsystem]}.", evidence, table)
    names = "; ".join(f"interval {i}: {s}" for i, s in per.items())
    return Diagnosis("mixed", f"The intervals disagree ({names}).", evidence, table)
