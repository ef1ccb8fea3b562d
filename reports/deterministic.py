"""What a --deterministic run's report says of its mode: what each pool's servers confirmed, and which gated pools
the calibration compared exactly (harness/calibrate.py: deterministic, and their controls showed no drift at all
and no flip)."""

from __future__ import annotations

from reports.controls import is_control


def deterministic_text(config: dict) -> str | None:
    """One sentence for summary.md and report.html from config.json; None unless the run was deterministic."""
    confirmed = config.get("deterministic")
    if not confirmed:
        return None
    by_evidence: dict[str, list[str]] = {}
    for pool, evidence in confirmed.items():
        by_evidence.setdefault(str(evidence), []).append(str(pool))
    said = "; ".join(f"{', '.join(pools)}: {evidence}" for evidence, pools in by_evidence.items())
    cal = config.get("calibration") or {}
    per_pool = cal.get("per_pool") or {}
    exact = list(cal.get("exact") or [])
    gated = [p for p in per_pool if p not in exact and not is_control(p)]
    if not per_pool:
        paths = "no calibration: no path was measured exact"
    elif exact:
        paths = (f"exact paths (their controls showed no drift and no flip; any drift is flagged, no flip is soft): "
                 f"{', '.join(exact)}" + (f"; calibrated tolerances elsewhere: {', '.join(gated)}" if gated else ""))
    else:
        paths = f"no path was exact (the controls drifted or flipped): calibrated tolerances for {', '.join(gated)}"
    return f"the run asked every pool for its deterministic mode ({said}); {paths}"
