"""Calibration per code path: which clean control each candidate pool is measured against, and path numerics.

A noisy target (bf16, a GPU engine) moves log-probs through numerics alone, and by how
much depends on the code path: a verify step, a prefill split at a restored checkpoint,
a batch. So each gated candidate pool is calibrated against the clean controls that
share its path (harness/calibrate.py starts them): speculation only (`ctl-i<I>-spec`,
no radix cache) for speculative numerics, cache only (`ctl-i<I>-cache`, no
speculation) for split prefills, the plain `baseline` (the reference's flags on a server
of its own) for batching where no path control exists. A full candidate (speculation +
cache) takes both path controls. Controls are never gated and never get a fault.

Path numerics: with calibration on, drift of a turn that restored nothing and that starts
at its first output token (before any verify step: the prefill's token) cannot come
from a checkpoint or a verify step; nor can the drift of a restored turn that starts
there and stays within what its own pool's turns that restored nothing show. Such rows
are not counted as drift; the verdict reports them, with the evidence, as not judged.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

BASELINE_POOL = "baseline"
CONTROL_PREFIX = "ctl-"
# a candidate variant -> the variants of the controls that share its code paths
PATHS = {"full": ("spec_only", "cache_only"), "spec_only": ("spec_only",), "cache_only": ("cache_only",),
         "cold": ()}
CONTROL_SUFFIX = {"spec_only": "spec", "cache_only": "cache"}


def is_control(pool: object) -> bool:
    """Whether a pool is a calibration control (not gated)."""
    name = str(pool)
    return name == BASELINE_POOL or name.startswith(CONTROL_PREFIX)


def control_name(interval: int, variant: str) -> str:
    """`ctl-i128-spec` / `ctl-i128-cache`: the clean control of `variant`'s path at `interval`."""
    return f"{CONTROL_PREFIX}i{interval}-{CONTROL_SUFFIX[variant]}"


def controls_of(pool: str, variant: str, interval: int | None, present: set[str]) -> list[str]:
    """The control pools (among `present`) that share a candidate pool's code paths; the baseline where no path
    control exists."""
    out = [control_name(interval, v) for v in PATHS.get(variant, ()) if interval is not None
           and control_name(interval, v) in present]
    if not out and BASELINE_POOL in present:
        out = [BASELINE_POOL]
    return out


def path_numerics(df: pd.DataFrame) -> pd.Series:
    """Rows (of gated pools) whose drift is path numerics (module doc); a boolean Series on df's index."""
    if not len(df):
        return pd.Series([], dtype=bool)
    drift = df["class"] == "drift"
    first = df["drift_onset"].fillna(-1) == 0
    unrestored = drift & first & ~df["restored"]
    own = df[unrestored].groupby("pool")["drift"].max()
    own_max = df["pool"].map(own).astype(float)
    restored = drift & first & df["restored"] & own_max.notna() & (df["drift"] <= own_max)
    return (unrestored | restored).fillna(False).astype(bool)


def path_numerics_lines(df: pd.DataFrame, mask: pd.Series, tolerances: dict[str, float]) -> list[str]:
    """Per pool: the path-numerics rows and their evidence, and what to do instead of raising the tolerance."""
    out = []
    for pool, g in df[mask].groupby("pool", sort=True):
        restored = int(g["restored"].sum())
        tol = tolerances.get(str(pool))
        tol_text = f" > the calibrated tolerance {tol:.3g}" if tol is not None else ""
        verify = g["spec_verify_ct"].dropna()
        out.append(
            f"pool {pool}: {len(g)} request(s) drift from their first output token, before any verify step "
            f"(drift up to {g['drift'].max():.3g}{tol_text}; {len(g) - restored} restored nothing"
            + (f", {restored} restored a checkpoint and drift no more than the pool's turns that restored nothing"
               if restored else "")
            + (f"; {int(verify.sum())} verify steps in them" if len(verify) else "")
            + "): path numerics of this configuration's prefill, which its controls do not share; not judged. "
            "Calibrate against this configuration's own path: --baseline-run a trusted run of it")
    return out


def restore_onsets(df: pd.DataFrame, first_drift: Mapping[str, float], tolerances: dict[str, float]) -> pd.Series:
    """Restored rows judged exact whose first output token moved past their pool's restore tolerance (the
    calibration's: 4 x the largest first-token drift of the controls' restored turns): the restore's own effect,
    hidden in a whole-turn tolerance sized for verify numerics. `first_drift`: key -> the first output token's
    drift (reports/facts.py). A boolean Series on df's index."""
    if not len(df) or not tolerances:
        return pd.Series(False, index=df.index)
    out = []
    for row in df[["key", "pool", "class", "restored"]].to_dict("records"):
        tol = tolerances.get(str(row["pool"]))
        d = first_drift.get(row["key"]) if row["restored"] else None
        out.append(bool(tol is not None and row["class"] == "exact" and d is not None and d > tol))
    return pd.Series(out, index=df.index)


RESTORE_ONSET_DETAIL = "first output token moved at the restore"


def with_restore_onsets(df: pd.DataFrame, first_drift: Mapping[str, float], tolerances: dict[str, float]
                        ) -> pd.DataFrame:
    """`df` with its restore-onset rows (restore_onsets) as drift, detail RESTORE_ONSET_DETAIL: the restore moved
    the first token, whatever the turn's tolerance. Idempotent (those rows are no longer `exact`)."""
    onset = restore_onsets(df, first_drift, tolerances)
    if not onset.any():
        return df
    return df.assign(**{"class": df["class"].where(~onset, "drift"),
                        "detail": df["detail"].where(~onset, RESTORE_ONSET_DETAIL)})
