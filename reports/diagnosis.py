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

from reports.controls import is_control
from reports.flip_rates import RateTest, where_rates_point
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
    "undetermined": "no single subsystem: the full candidate is flagged, but a --diagnose pool that restored nothing "
                    "has no control of its path, so its flags are path numerics (not judged) and speculation or "
                    "caching alone cannot be ruled out",
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
        """True when the floor's maximum is within FLOOR_MARGIN x of the tolerance (a floor of exactly 0, as a
        deterministic run's against its tolerance 0, is not)."""
        return self.max is not None and self.max > 0 and self.max * FLOOR_MARGIN >= self.tolerance

    def warnings(self, calibrated: bool = False) -> list[str]:
        """What the reader must be told about the oracle's footing. A calibrated run's tolerances come from the
        controls sharing each pool's path, and drift of turns that restored nothing before any verify step is
        reported as path numerics: it is never advised away by a tolerance raised for everything."""
        out = []
        if self.too_close and calibrated:
            out.append(f"the observed noise floor (max drift {self.max:.3g} over {self.requests} requests that "
                       f"restored nothing) is within {FLOOR_MARGIN:g}x of the loosest calibrated tolerance "
                       f"{self.tolerance:g}: each pool is judged against the controls of its own path (see the "
                       "calibration); drift from a turn's first token with nothing restored is path numerics")
        elif self.too_close:
            out.append(f"the observed noise floor (max drift {self.max:.3g} over {self.requests} requests that "
                       f"restored nothing) is within {FLOOR_MARGIN:g}x of the drift tolerance "
                       f"{self.tolerance:g}: numerics may be flagged as drift, or a bug outside the cache moves "
                       "log-probs (see the diagnosis); calibrate the tolerance per code path instead of raising "
                       "it for everything (--calibrate, or --baseline-run a trusted run)")
        if self.unmeasured:
            out.append(f"{self.unmeasured} request(s) without log-probs on both sides: classified by the "
                       "margin rule only (drift not measured)")
        return out


def noise_floor(df: pd.DataFrame, tolerance: float) -> NoiseFloor:
    """The observed floor of a requests frame."""
    answered = df.loc[df["class"] != "error", ["oracle", "cached_tokens", "drift"]] if len(df) else df
    unmeasured = int((answered["oracle"] == "margin").sum()) if len(answered) else 0
    cold = answered[(answered["cached_tokens"] == 0) & answered["drift"].notna()] if len(answered) else answered
    if not len(cold):
        return NoiseFloor(tolerance, 0, None, None, None, unmeasured)
    d = cold["drift"].astype(float).to_numpy()
    return NoiseFloor(tolerance, len(d), float(d.max()), float(np.percentile(d, 50)), float(np.percentile(d, 99)),
                      unmeasured)


@dataclass(frozen=True)
class Diagnosis:
    """The subsystem the evidence points at (a SUBSYSTEMS key, `mixed`, `crashed` or `undiagnosed`) and why."""

    subsystem: str
    headline: str
    evidence: list[str] = field(default_factory=list)
    table: pd.DataFrame | None = None  # per pool: variant, interval, requests, errors, flagged, ...


TABLE_COLUMNS = ["pool", "role", "variant", "interval", "requests", "errors", "flagged", "hard", "drift",
                 "path_numerics", "restored", "unjudged", "rate_findings"]


def pool_table(df: pd.DataFrame, findings: tuple[RateTest, ...] = ()) -> pd.DataFrame:
    """Per pool (with an interval or without, crashed or not, the calibration's controls too): its counts, and how
    many flip-rate tests found its flips piling up (`findings`: reports/flip_rates.py, the significant ones)."""
    rows = []
    for pool, g in df.groupby("pool", sort=True, dropna=False):
        interval = g["interval"].dropna()
        rows.append({"pool": str(pool), "role": "control" if is_control(pool) else "candidate",
                     "variant": str(g["variant"].iloc[0]), "interval": int(interval.iloc[0]) if len(interval) else None,
                     "requests": len(g), "errors": int((g["class"] == "error").sum()),
                     "flagged": int(g["class"].isin(FLAGGED).sum()), "hard": int((g["class"] == "hard").sum()),
                     "drift": int((g["class"] == "drift").sum()),
                     "path_numerics": int((g["class"] == "path_numerics").sum()),
                     "restored": int(g["restored"].fillna(False).astype(bool).sum()),
                     "unjudged": bool(g["unjudged_pool"].fillna(False).astype(bool).any())
                     if "unjudged_pool" in g else False,
                     "rate_findings": sum(1 for t in findings if t.pool == str(pool))})
    return pd.DataFrame(rows, columns=TABLE_COLUMNS).astype({"interval": "Int64"})


def _status(row: dict) -> str:
    """One pool's counts as the evidence shows them: `crashed (N errors)` for a pool that answered nothing."""
    answered = row["requests"] - row["errors"]
    if not answered:
        return f"{row['pool']} ({row['variant']}) crashed: {row['errors']}/{row['requests']} errors, nothing answered"
    if row.get("unjudged"):
        return (f"{row['pool']} ({row['variant']}) not judged: {row['path_numerics']}/{answered} path numerics "
                "(it restored nothing, and no control shares its path)")
    text = f"{row['pool']} ({row['variant']}) flagged {row['flagged']}/{answered}"
    extra = [f"{row['errors']} errors"] if row["errors"] else []
    extra += [f"{row['path_numerics']} path numerics"] if row["path_numerics"] else []
    extra += [f"{row['restored']} restored a checkpoint"]
    extra += [f"flips pile up in {row['rate_findings']} rate test(s)"] if row.get("rate_findings") else []
    return text + " (" + ", ".join(extra) + ")"


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


# where every flagged request ran with one of the two paths alone, the other cannot be at fault
ONE_PATH = {
    "speculation": "speculative verify / accept: every flagged request ran with speculation and no prefix cache "
                   "(nothing to restore), so the cache cannot be at fault",
    "caching": "caching / checkpoint tracking: every flagged request ran with a prefix cache and no speculation",
    "both": "both speculation and caching: flagged requests ran with speculation and no prefix cache, and with a "
            "prefix cache and no speculation",
}


def one_path_subsystem(variants: set[str]) -> str | None:
    """The subsystem the flagged requests' pool variants alone name (a ONE_PATH key) when none of them ran both
    speculation and a prefix cache; None otherwise."""
    if not variants or not variants <= {"spec_only", "cache_only"}:
        return None
    return interval_subsystem(dict.fromkeys(variants, 1))


_POOL_READS = ["pool", "interval", "variant", "class", "restored", "unjudged_pool"]  # what pool_table reads
_UNDIAGNOSED_READS = ["pool", "variant", "class", "restored", "onset_points_at", "restored_verify_crossed",
                      "restored_link"]


def _undiagnosed(df: pd.DataFrame, table: pd.DataFrame, findings: tuple[RateTest, ...]) -> Diagnosis:
    flagged = df[df["class"].isin(FLAGGED)]
    evidence = [f"flips pile up: {t.text()}" for t in findings] + [_status(r) for r in table.to_dict("records")]
    if not len(flagged) and findings:
        return Diagnosis("undiagnosed", "No single request was flagged, but flips pile up where numerics do not put "
                         f"them: {where_rates_point(findings)}; --diagnose would tell which subsystem.", evidence,
                         table)
    if not len(flagged):
        return Diagnosis("none", "Nothing points at a subsystem: no request was flagged (drift or hard).",
                         evidence, table)
    one_path = one_path_subsystem(set(flagged["variant"].astype(str)))
    if one_path is not None:
        pools = ", ".join(sorted(set(flagged["pool"].astype(str))))
        return Diagnosis(one_path, f"The evidence points at {ONE_PATH[one_path]} (pool(s) {pools}).",
                         [f"{len(flagged)} flagged request(s), all in pool(s) {pools}", *evidence], table)
    restored = flagged[flagged["restored"].fillna(False).astype(bool)]
    first = restored[restored["onset_points_at"] == "restored_checkpoint"]
    verify = restored[restored["restored_verify_crossed"].fillna(False).astype(bool)]
    position = restored[restored["restored_link"] == "position"]
    linked = f"{len(verify)} restored a checkpoint that the previous turn crossed inside a verify step"
    if len(position):  # the engine reports no verify steps: the link is by position, the step unknown
        linked = (f"{len(position)} restored a checkpoint the previous turn crossed (position-linked; whether inside "
                  "a verify step: unknown, the engine does not report verify steps)")
    evidence = [f"{len(flagged)} flagged request(s); {len(restored)} of them restored a checkpoint ({len(first)} "
                f"left the reference at it: in their prompt past it or from their first output token, {linked})",
                *evidence,
                "run with --diagnose to add speculation-only and cache-only pools and tell speculation, caching "
                "and their interplay apart"]
    if len(restored) == len(flagged):
        headline = ("The evidence points at the restored checkpoints (caching / checkpoint tracking, or the "
                    "speculation x cache interplay): every flagged request restored one; --diagnose would tell "
                    "which.")
    else:
        headline = (f"{len(flagged) - len(restored)} flagged request(s) restored nothing: not only the cache is "
                    "implicated; --diagnose would tell which subsystem.")
    return Diagnosis("undiagnosed", headline, evidence, table)


def _groups(table: pd.DataFrame) -> dict[str, list[dict]]:
    """Gated pools by interval; a pool without an interval (no radix cache: the interval does not apply to it,
    as vLLM's speculation-only pool) joins every interval's group (or, with none, one group `all`)."""
    gated = [r for r in table.to_dict("records") if r["role"] == "candidate"]
    intervals = sorted({int(r["interval"]) for r in gated if not pd.isna(r["interval"])})
    free = [r for r in gated if pd.isna(r["interval"])]
    if not intervals:
        return {"all pools": free}
    return {f"interval {i}": [r for r in gated if not pd.isna(r["interval"]) and int(r["interval"]) == i] + free
            for i in intervals}


def _group_result(rows: list[dict]) -> str:
    crashed = [r for r in rows if r["requests"] == r["errors"]]
    if any(r["variant"] == "full" for r in crashed):
        return "crashed"
    live = [r for r in rows if r not in crashed]
    # a pool whose flips pile up is flagged as a pool, though no single turn of it is
    found = interval_subsystem({r["variant"]: r["flagged"] + r.get("rate_findings", 0) for r in live})
    if found == "interplay" and any(r.get("unjudged") for r in live):  # a half that could not be judged
        return "undetermined"
    return found


def diagnose(df: pd.DataFrame, findings: tuple[RateTest, ...] = ()) -> Diagnosis:
    """Name the subsystem from the --diagnose pools (per interval; pools without an interval in every group;
    crashed pools by their errors), or say what the attribution suggests; the table has every pool. `findings`:
    the flip-rate tests that found flips piling up (Verdict.rate_findings): their pools count as flagged, and
    their lines lead the evidence."""
    if not len(df):
        return Diagnosis("none", "No candidate requests.")
    findings = tuple(findings)
    table = pool_table(df[[c for c in _POOL_READS if c in df]], findings)  # a pool's rows copy these columns only
    gated = table[table["role"] == "candidate"]
    if not {"spec_only", "cache_only"} <= set(gated["variant"]):
        return _undiagnosed(df.loc[~df["pool"].map(is_control), [c for c in _UNDIAGNOSED_READS if c in df]], table,
                            findings)
    groups = _groups(table)
    per = {name: _group_result(rows) for name, rows in groups.items()}
    evidence = [f"flips pile up: {t.text()}" for t in findings]
    evidence += [f"{name}: " + "; ".join(_status(r) for r in rows) + f" -> {per[name]}"
                 for name, rows in groups.items()]
    evidence += [f"control {_status(r)}" for r in table.to_dict("records") if r["role"] == "control"]
    errors = df.loc[df["class"] == "error", "error"].dropna().astype(str)
    if "crashed" in per.values():
        first = f" (first error: {errors.iloc[0][:200]})" if len(errors) else ""
        down = [r["pool"] for rows in groups.values() for r in rows if r["requests"] == r["errors"]]
        return Diagnosis("crashed", f"The full candidate crashed ({', '.join(dict.fromkeys(down))}: every request "
                         f"failed{first}): no subsystem can be named from its output; see the incidents and the "
                         "pools' logs.", evidence, table)
    found = set(per.values())
    if len(found) == 1:
        subsystem = found.pop()
        headline = f"The evidence points at {SUBSYSTEMS[subsystem]}."
        numerics = int(gated["path_numerics"].sum())
        if subsystem == "none" and numerics:
            headline = (f"The evidence points at no subsystem: no request was flagged in any pool, and {numerics} "
                        "request(s) are path numerics, not judged (the verdict says why).")
        return Diagnosis(subsystem, headline, evidence, table)
    names = "; ".join(f"{i}: {s}" for i, s in per.items())
    return Diagnosis("mixed", f"The intervals disagree ({names}).", evidence, table)
