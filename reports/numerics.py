"""Numerics as a hypothesis with a size: whether what a path's numerics were measured to do can flip a token.

Numerics (a kernel path, bf16 rounding, a batch) move every log-prob a little; they change a token only where
the two candidates were about as close as that. If every log-prob at a position moves by at most d, the gap
between two tokens changes by at most 2d (each moves by d, in opposite directions at worst), and a candidate
token that wins where the reference chose another closed a gap of at least the reference's top-1/top-2 margin
there. So a flip at reference margin m can be numerics only if m <= SWAP_FACTOR x d, with d the path's reach:
the most it was measured to move a log-prob, which is the largest of

* the drift before their flips (reports/oracle.py `Drift.before`, never the flip's own top-k: a wrong state
  would explain itself) of the pool's turns that restored nothing, where no checkpoint is involved;
* the largest drift of the controls that share its code path, and the largest reference margin at which one of
  them flipped a token (a gap the path's numerics demonstrably closed; the calibration allows flips up to twice
  it too), both from config.json's calibration (harness/calibrate.py);
* the pool's drift tolerance (the calibrated one, 4x its controls' drift; else the run's): the per-position move
  the gate already accepts as numerics on same tokens, so a flip within twice it must be accepted as well.

A flip beyond it (measured on vLLM's CPU build: a tiny fp32 Mamba2 with n-gram speculation flips 74 of 74 requests
at their first verify step, at reference margins 0.021 to 20.8, where no turn moved a log-prob by more than 3.1e-05
before its flip) is decisive: hard, gated, never soft and never path numerics, whatever the pool restored; the
verdict says, per pool, margin against reach. So is a flip that leaves nothing to weigh: one output a strict
prefix of the other, or no reference top-2 at the flip.
SWAP_FACTOR is the bound itself, not a safety margin: the reach is already the largest move seen anywhere on the
path (every position of every turn that restored nothing, the controls' turns) or the calibrated tolerance, which
holds 4x headroom over the controls, so a flip needing more than twice it needs a move no position of the path
ever showed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from reports.frame_rows import records

SWAP_FACTOR = 2.0  # a gap between two tokens moves by at most twice the largest move of either log-prob


@dataclass(frozen=True)
class NumericsScale:
    """What one gated pool's path was measured (or calibrated) to move a log-prob by."""

    pool: str
    tolerance: float  # the pool's drift tolerance
    own: float | None = None  # largest drift before their flips of the pool's turns that restored nothing
    controls: float | None = None  # largest drift of the controls sharing its path (calibration drift_max)
    control_flip: float | None = None  # largest reference margin at which one of those controls flipped

    @property
    def reach(self) -> float:
        """The most this path's numerics move a log-prob: the largest of its measures."""
        return max(v for v in (self.tolerance, self.own, self.controls, self.control_flip) if v is not None)

    @property
    def limit(self) -> float:
        """The largest reference margin at a flip that numerics of this reach can close."""
        return SWAP_FACTOR * self.reach

    def explains(self, margin: float | None) -> bool:
        """Whether numerics of this size can flip a token at reference margin `margin` (None: no margin to weigh,
        never)."""
        return margin is not None and not math.isnan(margin) and margin <= self.limit

    def evidence(self) -> str:
        """The measures the reach is the largest of, e.g. `its turns that restored nothing 0 (before any flip),
        its controls 3.8e-05, its tolerance 0.00015`."""
        parts = []
        if self.own is not None:
            parts.append(f"its turns that restored nothing {self.own:.3g} (before any flip)")
        if self.controls is not None:
            parts.append(f"its controls {self.controls:.3g}")
        if self.control_flip is not None:
            parts.append(f"its controls' flips at margins up to {self.control_flip:.3g}")
        return ", ".join(parts + [f"its tolerance {self.tolerance:.3g}"])


def _finite(value) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def pool_scales(df: pd.DataFrame, tolerances: Mapping[str, float], default_tolerance: float,
                calibration: Mapping[str, Mapping] | None = None) -> dict[str, NumericsScale]:
    """Per pool of a requests frame (the gated pools): its NumericsScale. `tolerances`: pool -> its drift tolerance
    (the others take `default_tolerance`); `calibration`: config.json's `calibration.per_pool` (its controls'
    `drift_max` and `flip_margin_max`)."""
    calibration = calibration or {}
    out = {}
    for pool, g in df.groupby("pool", sort=True):
        name = str(pool)
        unrestored = g[~g["restored"].astype(bool) & (g["class"] != "error")]["drift_before_flip"].dropna()
        cal = calibration.get(name) or {}
        out[name] = NumericsScale(name, float(tolerances.get(name, default_tolerance)),
                                  float(unrestored.max()) if len(unrestored) else None,
                                  _finite(cal.get("drift_max")), _finite(cal.get("flip_margin_max")))
    return out


def flips(df: pd.DataFrame) -> pd.Series:
    """Rows whose tokens left the reference's (a token flip, or one output a strict prefix of the other)."""
    if not len(df):
        return pd.Series([], dtype=bool)
    return (df["first_divergence"].notna() & (df["class"] != "error")).astype(bool)


def decisive(df: pd.DataFrame, scales: Mapping[str, NumericsScale]) -> pd.Series:
    """Rows whose flip no measured numerics of their pool explain (pools without a scale: none); a boolean Series
    on df's index."""
    if not len(df):
        return pd.Series([], dtype=bool)
    out = []
    for row in records(df, ["pool", "ref_margin", "cand_token", "ref_token"]):
        scale = scales.get(str(row["pool"]))
        weighable = pd.notna(row["cand_token"]) and pd.notna(row["ref_token"])
        out.append(scale is not None and not (weighable and scale.explains(_finite(row["ref_margin"]))))
    return flips(df) & pd.Series(out, index=df.index, dtype=bool)


def decisive_text(margin: float | None, scale: NumericsScale) -> str:
    """Why one flip is not numerics: its margin against twice the path's reach."""
    if margin is None:
        return "no reference margin to weigh at the flip: not numerics"
    return (f"margin {margin:.4g} > {SWAP_FACTOR:g} x {scale.reach:.3g}, the most this path's numerics "
            f"move a log-prob ({scale.evidence()}): not numerics")


def with_decisive_flips(df: pd.DataFrame, scales: Mapping[str, NumericsScale]) -> pd.DataFrame:
    """`df` with its soft flips that no measured numerics of their pool explain as hard, detail decisive_text.
    Idempotent (those rows are no longer soft)."""
    hit = decisive(df, scales) & (df["class"] == "soft") if len(df) else pd.Series([], dtype=bool)
    if not hit.any():
        return df
    detail = df["detail"].astype(object).copy()
    detail.loc[hit] = [decisive_text(_finite(m), scales[str(p)])
                       for p, m in zip(df.loc[hit, "pool"], df.loc[hit, "ref_margin"], strict=True)]
    return df.assign(**{"class": df["class"].where(~hit, "hard"), "detail": detail})


def decisive_lines(df: pd.DataFrame, mask: pd.Series, scales: Mapping[str, NumericsScale]) -> list[str]:
    """Per pool with decisive flips (`mask`: decisive's rows): how many, their reference margins against twice
    the path's reach, and what that reach was measured from."""
    out = []
    for pool, g in df[mask].groupby("pool", sort=True):
        scale = scales[str(pool)]
        margins = g["ref_margin"].where(g["cand_token"].notna() & g["ref_token"].notna()).dropna().astype(float)
        unweighed = len(g) - len(margins)
        where = g["first_divergence"].astype(int)
        at = (f"output {where.min()}" if where.min() == where.max() else f"outputs {where.min()}-{where.max()}")
        parts = [f"reference margin {margins.min():.3g}" + (f" to {margins.max():.3g}" if len(margins) > 1 else "")
                 + " at the flip"] if len(margins) else []
        if unweighed:
            parts.append(f"{unweighed} with no margin to weigh: an output cut short, or no reference top-2")
        out.append(f"pool {pool}: {len(g)} token flip(s) at {at} that no measured numerics explain ("
                   + "; ".join(parts) + f"), where {SWAP_FACTOR:g} x {scale.reach:.3g} = {scale.limit:.3g} is the "
                   f"most this path's numerics can close ({scale.evidence()}): hard mismatches, whatever the pool "
                   "restored")
    return out
