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
there and stays within what its own pool's turns that restored nothing show; nor can the
flip of a turn that restored nothing when it follows such drift. A pool that restored
nothing and that no control shares a path with (calibrated against the plain baseline
only, though it speculates: vLLM's speculation-only pool) has all its flags counted so:
it did not exercise the bug class, and no control measures its path. Such rows are not
counted as drift or hard; the verdict reports them, with the evidence, as not judged.
Numerics have a size, though: a token flip whose reference margin is beyond what the
path's measured numerics can close (reports/numerics.py) is never path numerics, whatever
the pool restored or shares; the caller (reports/render.py `judge`) takes those out.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping

import numpy as np
import pandas as pd

from reports.facts import TokenFacts
from reports.oracle import FLAGGED

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


PATH_WORDS = {"full": "speculation and a prefix cache", "spec_only": "speculation, no prefix cache",
              "cache_only": "a prefix cache, no speculation"}


def unshared_pools(df: pd.DataFrame, calibration: Mapping[str, Mapping]) -> dict[str, Mapping]:
    """Gated pools that restored nothing and that no control shares a code path with: calibrated against the
    plain baseline only (vLLM's speculation-only pool), though they speculate or cache. Having restored nothing,
    they did not exercise the bug class; with no control of their path, its numerics are unknown: none of their
    flags can be judged. pool -> its calibration entry (config.json `calibration.per_pool`)."""
    out = {}
    for pool, g in df.groupby("pool", sort=True):
        cal = calibration.get(str(pool))
        if not cal or is_control(pool) or tuple(cal.get("controls") or ()) != (BASELINE_POOL,):
            continue
        if str(g["variant"].iloc[0]) in PATH_WORDS and not g["restored"].astype(bool).any():
            out[str(pool)] = cal
    return out


def path_numerics(df: pd.DataFrame, unshared: Collection[str] = ()) -> pd.Series:
    """Rows (of gated pools) whose drift is path numerics (module doc); a boolean Series on df's index. A turn
    that restored nothing and flips a token after drift that started at its first output token is one too: the
    flip comes after the prefill's numerics had already moved it (a flip at the first token itself, or one with no
    drift before it, stays judged); a restored turn that flips is always judged."""
    if not len(df):
        return pd.Series([], dtype=bool)
    drift = df["class"] == "drift"
    first = df["drift_onset"].fillna(-1) == 0
    flipped_after = (df["class"] == "hard") & (df["first_divergence"].fillna(-1) > 0) if "first_divergence" in df \
        else pd.Series(False, index=df.index)
    unrestored = (drift | flipped_after) & first & ~df["restored"]
    own = df[unrestored].groupby("pool")["drift"].max()
    own_max = df["pool"].map(own).astype(float)
    restored = drift & first & df["restored"] & own_max.notna() & (df["drift"] <= own_max)
    uncontrolled = df["pool"].astype(str).isin(set(unshared)) & df["class"].isin(FLAGGED)
    # a restore window past its limits moved before any output, on the prefill path the reference shares
    windowed = df["window_status"].eq("flagged") if "window_status" in df else pd.Series(False, index=df.index)
    return ((unrestored | restored | uncontrolled) & ~windowed).fillna(False).astype(bool)


def _unshared_line(pool: str, g: pd.DataFrame, cal: Mapping) -> str:
    """The evidence line of a pool whose every flag is path numerics (unshared_pools)."""
    onset = g["drift_onset"]
    at_first, later, none = int((onset == 0).sum()), int((onset > 0).sum()), int(onset.isna().sum())
    drift_max, control_max = g["drift"].max(), cal.get("drift_max")
    verify = g["spec_verify_ct"].dropna()
    return (f"pool {pool}: restored nothing, and no control shares its path ({PATH_WORDS[str(g['variant'].iloc[0])]}; "
            f"calibrated against {BASELINE_POOL} only"
            + (f", whose largest drift is {float(control_max):.3g}" if control_max is not None else "")
            + f"): its {len(g)} flagged request(s) ({int((g['class'] == 'hard').sum())} hard, "
            f"{int((g['class'] == 'drift').sum())} drift"
            + (f"; drift up to {float(drift_max):.3g}" if pd.notna(drift_max) else "")
            + f", from the first output token (the prefill's) in {at_first}, from a later output in {later}"
            + (f", a flip with no drift before it in {none}" if none else "")
            + (f"; {int(verify.sum())} verify steps in them" if len(verify) else "")
            + ") are this configuration's path numerics, or a bug on that path, and no control here tells them "
            "apart; not judged. To judge this path: --baseline-run a trusted run of this configuration")


def path_numerics_lines(df: pd.DataFrame, mask: pd.Series, tolerances: dict[str, float],
                        facts: TokenFacts | None = None,
                        unshared: Mapping[str, Mapping] | None = None) -> list[str]:
    """Per pool: the path-numerics rows and their evidence (the first output token's drift, from `facts`,
    reports/facts.py; the turn's largest; the flips that followed; for `unshared` pools, unshared_pools'
    entries, what made every flag path numerics), and what to do instead of raising the tolerance."""
    unshared = unshared or {}
    out = []
    for pool, g in df[mask].groupby("pool", sort=True):
        if str(pool) in unshared:
            out.append(_unshared_line(str(pool), g, unshared[str(pool)]))
            continue
        restored = int(g["restored"].sum())
        flipped = int((g["class"] == "hard").sum())
        tol = tolerances.get(str(pool))
        firsts = [d for d in facts.first_drifts(g["key"]) if d is not None] if facts is not None and "key" in g \
            else []
        first_text = f"first-token drift up to {max(firsts):.3g}, " if firsts else ""
        tol_text = f"; the calibrated tolerance {tol:.3g}" if tol is not None else ""
        verify = g["spec_verify_ct"].dropna()
        out.append(
            f"pool {pool}: {len(g)} request(s) drift from their first output token, before any verify step "
            f"({first_text}up to {g['drift'].max():.3g} over the turn{tol_text}; {len(g) - restored} restored "
            "nothing"
            + (f", {restored} restored a checkpoint and drift no more than the pool's turns that restored nothing"
               if restored else "")
            + (f"; {flipped} of them then flip a token" if flipped else "")
            + (f"; {int(verify.sum())} verify steps in them" if len(verify) else "")
            + "): path numerics of this configuration's prefill, which its controls do not share; not judged. "
            "Calibrate against this configuration's own path: --baseline-run a trusted run of it")
    return out


def restore_onsets(df: pd.DataFrame, facts: TokenFacts, tolerances: dict[str, float]) -> pd.Series:
    """Restored rows judged exact whose first output token moved past their pool's restore tolerance (the
    calibration's: 4 x the largest first-token drift of the controls' restored turns): the restore's own effect,
    hidden in a whole-turn tolerance sized for verify numerics. `facts`: the first output token's drift per
    candidate (reports/facts.py). A boolean Series on df's index."""
    out = np.zeros(len(df), dtype=bool)
    if len(df) and tolerances:
        mask = (df["restored"].astype(bool) & (df["class"] == "exact")).to_numpy(dtype=bool)
        if mask.any():
            rows = df.loc[mask, ["pool", "key"]]
            tol = rows["pool"].astype(str).map(tolerances).to_numpy(dtype=float)  # NaN: no tolerance
            drift = np.array([math.nan if d is None else d for d in facts.first_drifts(rows["key"])], dtype=float)
            out[mask] = drift > tol  # NaN on either side: False
    return pd.Series(out, index=df.index)


RESTORE_ONSET_DETAIL = "first output token moved at the restore"


def with_restore_onsets(df: pd.DataFrame, facts: TokenFacts, tolerances: dict[str, float]) -> pd.DataFrame:
    """`df` with its restore-onset rows (restore_onsets) as drift, detail RESTORE_ONSET_DETAIL: the restore moved
    the first token, whatever the turn's tolerance. Idempotent (those rows are no longer `exact`)."""
    onset = restore_onsets(df, facts, tolerances)
    if not onset.any():
        return df
    return df.assign(**{"class": df["class"].where(~onset, "drift"),
                        "detail": df["detail"].where(~onset, RESTORE_ONSET_DETAIL)})
