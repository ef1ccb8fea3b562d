"""Calibrating the oracle per target from a clean baseline (DESIGN.md 3.3).

A `baseline` pool runs the target with speculation and prefix caching off, as the
reference does, but as a separate server driven like a candidate: what it
differs from the reference by is the target's own noise (batching, kernel
paths, bf16). The drift tolerance and the margin threshold of the gate are set
from it: tolerance = max(DRIFT_FLOOR, DRIFT_FACTOR x the baseline's largest
drift); margin threshold = max(the configured one, MARGIN_FACTOR x the largest
reference margin at which the baseline flipped a token). A tolerance given with
--drift-tolerance is kept (the calibration is still reported). The result goes
into config.json (`calibration`, and `gate`), and the report shows it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from records.jsonl import load_run
from records.rundir import load_config, write_json
from reports.analyze import analyze
from reports.gate import GateThresholds

BASELINE_POOL = "baseline"
DRIFT_FLOOR = 1e-4  # below this, differences are float32 rounding: never gate tighter
DRIFT_FACTOR = 4.0
MARGIN_FACTOR = 2.0


@dataclass(frozen=True)
class Calibration:
    """What the baseline showed, and the thresholds the gate uses because of it."""

    requests: int
    drift_max: float | None  # largest log-prob drift of the baseline (same tokens, common prefix)
    flips: int  # baseline requests whose tokens differ from the reference
    flip_margin_max: float | None  # largest reference top-1/top-2 margin at such a flip
    drift_tolerance: float
    margin_threshold: float
    tolerance_source: str  # "calibrated" or "--drift-tolerance"

    def text(self) -> str:
        """One sentence for the report."""
        drift = "no drift measured" if self.drift_max is None else f"max drift {self.drift_max:.3g}"
        flips = f"{self.flips} token flip(s)" + (f" at reference margins up to {self.flip_margin_max:.3g}"
                                                 if self.flip_margin_max is not None else "")
        return (f"clean baseline (speculation and prefix caching off, {self.requests} requests vs the reference): "
                f"{drift}, {flips}; gate drift tolerance {self.drift_tolerance:.3g} ({self.tolerance_source}), "
                f"margin threshold {self.margin_threshold:.3g}")


def _finite(values) -> list[float]:
    return [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]


def calibrate(baseline_df, gate: GateThresholds, tolerance_given: bool) -> Calibration:
    """The calibration from the baseline pool's analyzed requests (reports.analyze frame)."""
    answered = baseline_df[baseline_df["class"] != "error"] if len(baseline_df) else baseline_df
    drifts = _finite(answered["drift"]) if len(answered) else []
    flipped = answered[answered["class"].isin(["soft", "hard"])] if len(answered) else answered
    margins = _finite(flipped["ref_margin"]) if len(flipped) else []
    drift_max = max(drifts) if drifts else None
    flip_margin = max(margins) if margins else None
    tolerance = gate.drift_tolerance if tolerance_given else max(DRIFT_FLOOR, DRIFT_FACTOR * (drift_max or 0.0))
    margin = max(gate.margin_threshold, MARGIN_FACTOR * (flip_margin or 0.0))
    return Calibration(len(answered), drift_max, len(flipped), flip_margin, tolerance, margin,
                       "--drift-tolerance" if tolerance_given else "calibrated")


def calibrated_gate(run_dir: Path, gate: GateThresholds, tolerance_given: bool) -> GateThresholds:
    """Calibrate from the run's baseline records; record it in config.json; the thresholds to gate with.

    Without baseline records (none answered) the configured thresholds stay, and config.json says so."""
    run = load_run(run_dir)
    base = [r for r in run.candidates if r.get("pool") == BASELINE_POOL]
    config = load_config(run_dir)
    if not base:
        config["calibration"] = {"text": "no baseline records: thresholds not calibrated"}
        write_json(run_dir / "config.json", config)
        return gate
    df = analyze(base, run.references, threshold=gate.margin_threshold, tolerance=gate.drift_tolerance)
    cal = calibrate(df, gate, tolerance_given)
    calibrated = replace(gate, drift_tolerance=cal.drift_tolerance, margin_threshold=cal.margin_threshold)
    config["calibration"] = {**asdict(cal), "text": cal.text()}
    config["gate"] = asdict(calibrated)
    write_json(run_dir / "config.json", config)
    return calibrated
