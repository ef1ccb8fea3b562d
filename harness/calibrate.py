"""Calibrating the oracle per target and per code path, from clean controls (DESIGN.md 3.3; reports/controls.py).

A noisy target (the built-in engine in bf16, vLLM; or any run with --calibrate or
--baseline-run) is calibrated. Each gated candidate pool is measured against the clean
controls that share its code path: on the built-in engine `ctl-i<I>-spec` (speculation,
no radix cache) and `ctl-i<I>-cache` (radix cache, no speculation), started beside the
candidates, never with --inject-fault; on vLLM the `baseline` (the reference's flags on
a server of its own). With `--baseline-run RUN_DIR` the controls are a trusted run's
records instead: its pool of the same name (the same configuration on the trusted
build), else its path controls. Per pool: tolerance = max(DRIFT_FLOOR, DRIFT_FACTOR x
the controls' largest drift); the drift envelope (reports/envelope.py) = ENVELOPE_FACTOR x the controls' largest
drift summed over the first n outputs; margin threshold = max(the configured one, MARGIN_FACTOR x
the largest reference margin at which a control flipped a token); the soft-flip rate
allowed = max(--max-soft-rate, SOFT_FACTOR x the controls' flip rate p, p + SOFT_SIGMAS x the binomial spread
of p over the gated pool's n requests, sqrt(p(1 - p)/n)): a flip rate measured on a few dozen requests is itself
noisy, so a clean pool's share of near-tie flips may exceed twice the controls' by chance. A tolerance given
with --drift-tolerance is kept (the calibration is still reported). Under --deterministic a pool whose controls
show no drift at all and no flip is compared exactly (`exact`: tolerance and margin threshold 0, the restore and
window checks at 0, no envelope): any drift is flagged, no flip is soft. The result goes into
config.json (`calibration`, with `per_pool`, and `gate`); the report shows it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from records.rundir import load_config, write_json
from reports.analyze_run import AnalyzedRun, analyze_run
from reports.controls import BASELINE_POOL, controls_of, is_control
from reports.envelope import DRIFT_FLOOR, ENVELOPE_FACTOR, LADDER, Envelope
from reports.flip_rates import flips_by_point
from reports.gate import GateThresholds
from reports.window import WindowFact

if TYPE_CHECKING:
    from harness.config import RunConfig

__all__ = ["BASELINE_POOL", "Calibration", "calibrate", "calibrated_gate", "calibrating"]
DRIFT_FACTOR = 4.0
MARGIN_FACTOR = 2.0
SOFT_FACTOR = 2.0  # the gate's soft-flip rate: at least twice the controls' rate of numerics flips
SOFT_SIGMAS = 3.0  # ... and at least that rate plus 3 binomial standard deviations at the gated pool's size


def calibrating(cfg: RunConfig) -> bool:
    """Whether the run is calibrated: --calibrate, --baseline-run, or a noisy target (the built-in engine in a
    dtype other than float32, vLLM, endpoints: its settings say); an exact target keeps its tolerance."""
    return bool(cfg.calibrate or cfg.baseline_run or cfg.target.noisy)


@dataclass(frozen=True)
class Calibration:
    """What the controls showed, and the thresholds the gate uses because of it."""

    requests: int
    drift_max: float | None  # largest log-prob drift of the controls (same tokens, common prefix)
    flips: int  # control requests whose tokens differ from the reference
    flip_margin_max: float | None  # largest reference top-1/top-2 margin at such a flip
    drift_tolerance: float
    margin_threshold: float
    tolerance_source: str  # "calibrated" or "--drift-tolerance"
    controls: tuple[str, ...] = (BASELINE_POOL,)
    # max(DRIFT_FLOOR, DRIFT_FACTOR x the controls' largest first-token drift of a restored turn); None: no control
    # restored anything. A restored turn whose first token moves past it is drift (reports/controls.py)
    restore_tolerance: float | None = None
    # the drift envelope (reports/envelope.py): ENVELOPE_FACTOR x the controls' largest cumulative drift over the
    # first LADDER[k] outputs; None with --drift-tolerance or no control records
    envelope: tuple[float, ...] | None = None
    # the restore window's limits (reports/window.py): DRIFT_FACTOR x the largest window drift of the controls'
    # restored turns, and ENVELOPE_FACTOR x their window ladder sums; None: no control window was compared
    window_tolerance: float | None = None
    window_envelope: tuple[float, ...] | None = None
    # per sweep point, [answered, flipped] turns of the controls together: what the soft-excess test (reports/
    # flip_rates.py) compares each sweep point of the pool with
    flips_by_point: dict[str, list[int]] | None = None
    # --deterministic, and the controls showed no drift at all and no flip: the pool is compared exactly (drift
    # tolerance 0 on every check, margin threshold 0: any drift is flagged, no flip is soft)
    exact: bool = False

    def text(self) -> str:
        """One sentence for the report."""
        drift = "no drift measured" if self.drift_max is None else f"max drift {self.drift_max:.3g}"
        flips = f"{self.flips} token flip(s)" + (f" at reference margins up to {self.flip_margin_max:.3g}"
                                                 if self.flip_margin_max is not None else "")
        what = ("baseline (speculation and prefix caching off" if self.controls == (BASELINE_POOL,)
                else f"{' + '.join(self.controls)} (the controls sharing its code paths")
        restore = (f", restore tolerance {self.restore_tolerance:.3g} (first output token of a restored turn)"
                   if self.restore_tolerance is not None else "")
        envelope = (f", drift envelope {', '.join(f'{v:.3g}' for v in self.envelope[:5])} over the first "
                    f"{', '.join(map(str, LADDER[:5]))} outputs ({ENVELOPE_FACTOR:g}x the controls' summed drift)"
                    if self.envelope is not None else "")
        window = (f", restore window tolerance {self.window_tolerance:.3g}"
                  + (f" and envelope {', '.join(f'{v:.3g}' for v in self.window_envelope[:3])} over the first "
                     f"{', '.join(map(str, LADDER[:3]))} prompt tokens past a restored checkpoint"
                     if self.window_envelope is not None else "")
                  if self.window_tolerance is not None else "")
        if self.exact:
            return (f"clean {what}, {self.requests} requests vs the reference): {drift}, {flips} in deterministic "
                    "mode: EXACT, any drift is flagged and no flip is soft (tolerance 0, margin threshold 0)")
        return (f"clean {what}, {self.requests} requests vs the reference): {drift}, {flips}; gate drift "
                f"tolerance {self.drift_tolerance:.3g} ({self.tolerance_source}), margin threshold "
                f"{self.margin_threshold:.3g}{restore}{envelope}{window}")


def _finite(values) -> list[float]:
    return [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]


def calibrate(control_df, gate: GateThresholds, tolerance_given: bool,
              controls: tuple[str, ...] = (BASELINE_POOL,), deterministic: bool = False) -> Calibration:
    """The calibration from control pools' analyzed requests (reports.analyze frame). With `deterministic` (the
    run's --deterministic) controls that answered with no drift at all and no flip make the pool exact."""
    answered = control_df[control_df["class"] != "error"] if len(control_df) else control_df
    drifts = _finite(answered["drift"]) if len(answered) else []
    flipped = answered[answered["class"].isin(["soft", "hard"])] if len(answered) else answered
    margins = _finite(flipped["ref_margin"]) if len(flipped) else []
    drift_max = max(drifts) if drifts else None
    flip_margin = max(margins) if margins else None
    tolerance = gate.drift_tolerance if tolerance_given else max(DRIFT_FLOOR, DRIFT_FACTOR * (drift_max or 0.0))
    margin = max(gate.margin_threshold, MARGIN_FACTOR * (flip_margin or 0.0))
    exact = deterministic and not tolerance_given and drift_max == 0 and not len(flipped)
    if exact:
        tolerance, margin = 0.0, 0.0
    return Calibration(len(answered), drift_max, len(flipped), flip_margin, tolerance, margin,
                       "--drift-tolerance" if tolerance_given else "calibrated", tuple(controls),
                       flips_by_point=flips_by_point(control_df), exact=exact)


def _pool_shapes(df) -> dict[str, tuple[str, int | None]]:
    """pool -> (variant, interval) of a requests frame."""
    out = {}
    for pool, g in df.groupby("pool", sort=True):
        interval = g["interval"].dropna()
        out[str(pool)] = (str(g["variant"].iloc[0]), int(interval.iloc[0]) if len(interval) else None)
    return out


def per_path(df, source_df, gate: GateThresholds, tolerance_given: bool, from_run: bool,
             deterministic: bool = False) -> tuple[dict[str, Calibration], list[str]]:
    """Per pool of `df`: its Calibration from the controls in `source_df` (this run's, or a trusted run's with
    `from_run`), and the pools no control shares a path with (they keep the configured thresholds)."""
    present = set(map(str, source_df["pool"].dropna())) if len(source_df) else set()
    out, uncalibrated = {}, []
    for pool, (variant, interval) in _pool_shapes(df).items():
        if is_control(pool):
            ctrls = [pool] if pool in present else []
        elif from_run and pool in present:
            ctrls = [pool]  # the same configuration on the trusted build
        else:
            ctrls = controls_of(pool, variant, interval, present)
        if not ctrls:
            uncalibrated.append(pool)
            continue
        out[pool] = calibrate(source_df[source_df["pool"].isin(ctrls)], gate, tolerance_given, tuple(ctrls),
                              deterministic)
    return out, uncalibrated


def _rows(run: AnalyzedRun) -> list[dict]:
    """Each candidate of `run`, in record order: its key, pool, cached tokens and error (None when it has none)."""
    df = run.df[["key", "pool", "cached_tokens", "error"]]
    return [{k: (None if pd.isna(v) else v) for k, v in r.items()} for r in df.to_dict("records")]


def with_restore_tolerance(cal: Calibration, run: AnalyzedRun) -> Calibration:
    """`cal` with the restore tolerance of its controls' restored turns in `run` (their first output token's
    drift, `run.facts`)."""
    rows = [r for r in _rows(run) if r["pool"] in cal.controls and (r["cached_tokens"] or 0) > 0 and not r["error"]]
    drifts = [d for d in run.facts.first_drifts([r["key"] for r in rows]) if d is not None]
    if not drifts:
        return cal
    return replace(cal, restore_tolerance=max(DRIFT_FLOOR, DRIFT_FACTOR * max(drifts)))


def with_window_limits(cal: Calibration, run: AnalyzedRun) -> Calibration:
    """`cal` with the restore window's limits from its controls' compared windows in `run` (their restored turns'
    `run.facts`); with --drift-tolerance the user's tolerance, no envelope. Unchanged without any."""
    keys = [r["key"] for r in _rows(run) if r["pool"] in cal.controls]
    facts = [f for f in run.facts.windows(keys) if isinstance(f, WindowFact)]
    if not facts:
        return cal
    if cal.tolerance_source != "calibrated":
        return replace(cal, window_tolerance=cal.drift_tolerance)
    env = Envelope.of([f.sums for f in facts])
    return replace(cal, window_tolerance=max(DRIFT_FLOOR, DRIFT_FACTOR * max(f.drift for f in facts)),
                   window_envelope=env.limits if env is not None else None)


def ladder_sums_by_pool(pools: set[str], run: AnalyzedRun) -> dict[str, list[tuple[float, ...]]]:
    """Per pool of `pools`: the ladder sums (reports/envelope.py) of its answered records in `run` (analyzed
    with those pools among its `ladder_pools`), in record order."""
    out: dict[str, list[tuple[float, ...]]] = {p: [] for p in pools}
    rows = [r for r in _rows(run) if r["pool"] in out]
    for r, sums in zip(rows, run.facts.ladders([r["key"] for r in rows]), strict=True):
        if sums is not None:
            out[r["pool"]].append(sums)
    return out


def with_envelope(cal: Calibration, sums: dict[str, list[tuple[float, ...]]]) -> Calibration:
    """`cal` with the drift envelope of its controls' answered records (`sums`: ladder_sums_by_pool); unchanged
    when the tolerance was given (--drift-tolerance: the user's limit alone) or no control answered."""
    if cal.tolerance_source != "calibrated":
        return cal
    env = Envelope.of([s for pool in cal.controls for s in sums.get(pool, ())])
    return replace(cal, envelope=env.limits) if env is not None else cal


def exact_limits(cal: Calibration) -> Calibration:
    """An exact pool's restore and window checks at tolerance 0, and no envelope (tolerance 0 flags first)."""
    if not cal.exact:
        return cal
    return replace(cal, restore_tolerance=None if cal.restore_tolerance is None else 0.0, envelope=None,
                   window_tolerance=None if cal.window_tolerance is None else 0.0, window_envelope=None)


def _text(cals: dict[str, Calibration], uncalibrated: list[str], source: str) -> str:
    gated = {p: c for p, c in cals.items() if not is_control(p)}
    groups: dict[tuple, list[str]] = {}
    for pool, cal in gated.items():
        groups.setdefault(cal.controls, []).append(pool)
    parts = [f"{gated[pools[0]].text()} -> pool(s) {', '.join(pools)}" for pools in groups.values()]
    if uncalibrated:
        parts.append(f"no control shares a code path with pool(s) {', '.join(uncalibrated)}: configured thresholds")
    return (source + "; ".join(parts)) if parts else "no control records: thresholds not calibrated"


def allowed_soft_rate(p: float, n: int) -> float:
    """The soft-flip rate a pool of `n` requests may show when its controls flipped a share `p` of theirs:
    max(SOFT_FACTOR x p, p + SOFT_SIGMAS x sqrt(p (1 - p) / n)); 0 when the controls never flipped."""
    if p <= 0 or n <= 0:
        return 0.0
    return max(SOFT_FACTOR * p, p + SOFT_SIGMAS * math.sqrt(p * (1 - p) / n))


def limits_of(cal: Calibration) -> tuple:
    """A pool's (margin threshold, drift tolerance, envelope) for reports.analyze."""
    return cal.margin_threshold, cal.drift_tolerance, Envelope(cal.envelope) if cal.envelope is not None else None


def calibrated_gate(run_dir: Path, gate: GateThresholds, tolerance_given: bool, baseline_run: str | None = None,
                    cluster: str | None = None) -> tuple[GateThresholds, dict[str, tuple]]:
    """Calibrate from the run's controls (or `baseline_run`'s records); record it in config.json; the thresholds
    to gate with and the per-pool (margin threshold, drift tolerance, envelope) for reports.analyze.

    Without control records the configured thresholds stay, and config.json says so. The records are streamed
    (reports/analyze_run.py: bounded memory at any run size), the run's, then the trusted run's."""
    config = load_config(run_dir)
    limits = dict(threshold=gate.margin_threshold, tolerance=gate.drift_tolerance)
    run = analyze_run(run_dir, **limits, ladder_pools=None if baseline_run else is_control, cluster=cluster)
    df = run.df
    source = ""
    if baseline_run:  # any of its pools may be a control: its pool of a gated pool's name, else its path controls
        source_run = analyze_run(Path(baseline_run), **limits, ladder_pools=lambda pool: True, cluster=cluster)
        source_df = source_run.df
        source = f"from the trusted run {baseline_run}: "
    else:
        source_run, source_df = run, df[df["pool"].map(is_control)]
    deterministic = bool((config.get("run_config") or {}).get("deterministic"))
    cals, uncalibrated = per_path(df, source_df, gate, tolerance_given, bool(baseline_run), deterministic)
    sums = ladder_sums_by_pool({c for cal in cals.values() for c in cal.controls}, source_run)
    cals = {p: exact_limits(with_window_limits(with_envelope(with_restore_tolerance(c, source_run), sums), source_run))
            for p, c in cals.items()}
    per_pool = {p: limits_of(c) for p, c in cals.items()}
    gated = [c for p, c in cals.items() if not is_control(p)]
    calibrated = gate
    if gated:  # the run-wide figures (noise floor, plots) take the loosest pool's
        # bf16 flips near-tie tokens through numerics alone (8% of requests at concurrency 4, docs/engine.md): the
        # soft-flip rate the gate allows is at least SOFT_FACTOR x the controls' flip rate
        soft_rate = max(allowed_soft_rate(c.flips / c.requests if c.requests else 0.0, int((df["pool"] == p).sum()))
                        for p, c in cals.items() if not is_control(p))
        calibrated = replace(gate, drift_tolerance=max(c.drift_tolerance for c in gated),
                             margin_threshold=max(c.margin_threshold for c in gated),
                             max_soft_rate=min(1.0, max(gate.max_soft_rate, soft_rate)))
    controls = sorted({c for cal in cals.values() for c in cal.controls})
    config["calibration"] = {
        "requests": sum(int((source_df["pool"] == c).sum()) for c in controls) if len(source_df) else 0,
        "controls": controls, "baseline_run": baseline_run, "uncalibrated": uncalibrated,
        "per_pool": {p: asdict(c) for p, c in cals.items()},
        "exact": sorted(p for p, c in cals.items() if c.exact and not is_control(p)),
        "text": _text(cals, uncalibrated, source)
        + (f"; soft-flip rate allowed {100 * calibrated.max_soft_rate:.1f}% (the controls' flip rate: "
           f"{SOFT_FACTOR:g}x, or plus {SOFT_SIGMAS:g} binomial standard deviations at the pool's size)"
           if calibrated.max_soft_rate > gate.max_soft_rate else "")}
    config["gate"] = asdict(calibrated)
    write_json(run_dir / "config.json", config)
    return calibrated, per_pool
