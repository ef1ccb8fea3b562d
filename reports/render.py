"""Rebuild every table, plot and page of a run directory from its records alone.

    python -m reports.render RUN_DIR [--margin-threshold X] [--max-soft-rate Y] [--max-hard N] [--max-errors N]
                                     [--drift-tolerance T] [--max-drift N] [--cluster ADDRESS]

Prints the verdict's headline and the report's path; exits 0 (pass), 1 (gate
failed), 2 (no records to judge: the harness failed) or 3 (inconclusive: the run did
not exercise what it gates, reports/exercised.py). A calibrated run (config.json's
`calibration`, harness/calibrate.py) is re-judged with its per-pool thresholds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from records.incidents import load_incidents
from records.reader import RunReader
from records.rundir import load_config
from reports.analyze_run import AnalyzedRun, analyze_run
from reports.controls import is_control, path_numerics, path_numerics_lines, unshared_pools, with_restore_onsets
from reports.diagnosis import diagnose, noise_floor
from reports.envelope import Envelope
from reports.exercised import server_acceptance, unexercised
from reports.facts import TokenFacts
from reports.flip_rates import rate_tests, with_control_flips
from reports.gate import EXIT_HARNESS_FAILED, GateThresholds, Verdict, evaluate
from reports.html import write_html
from reports.html_cases import worst_cases
from reports.junit import write_junit
from reports.numerics import NumericsScale, decisive, decisive_lines, pool_scales, with_decisive_flips
from reports.oracle import FLAGGED
from reports.paired import paired_check
from reports.plots import write_plots
from reports.release import release
from reports.results import RunResults
from reports.summary import render_summary
from reports.tables import write_tables
from reports.window import WINDOW_READS, WindowLimits, unprobed_reason, window_lines, with_windows


class NoRecordsError(RuntimeError):
    """The run directory holds no candidate records: there is nothing to judge."""


def _warnings(run: AnalyzedRun, df) -> list[str]:
    """What the reader must know about the records themselves."""
    warnings = []
    if run.truncated:
        warnings.append(f"ignored truncated last line(s): {', '.join(run.truncated)}")
    if run.corrupt:
        warnings.append(f"skipped unparseable line(s): {', '.join(run.corrupt)}")
    if run.duplicates:
        warnings.append(f"dropped {run.duplicates} record(s) whose key was already recorded")
    missing = int((df["detail"] == "no reference").sum())
    if missing:
        warnings.append(f"{missing} candidate request(s) have no reference record (counted as errors)")
    return warnings


def _per_pool(config: dict) -> dict[str, tuple] | None:
    """The calibration's per-pool (margin threshold, drift tolerance, envelope) saved in config.json
    (harness/calibrate.py)."""
    pools = (config.get("calibration") or {}).get("per_pool")
    if not isinstance(pools, dict):
        return None
    return {p: (float(c["margin_threshold"]), float(c["drift_tolerance"]), Envelope.from_json(c.get("envelope")))
            for p, c in pools.items()}


def _restore_tolerances(config: dict) -> dict[str, float]:
    """Each calibrated pool's restore tolerance (harness/calibrate.py), where its controls restored anything."""
    pools = (config.get("calibration") or {}).get("per_pool") or {}
    return {p: float(c["restore_tolerance"]) for p, c in pools.items() if c.get("restore_tolerance") is not None}


def _window_limits(config: dict, thresholds: GateThresholds) -> tuple[dict[str, WindowLimits], WindowLimits]:
    """Each calibrated pool's restore-window limits (harness/calibrate.py; its drift tolerance where no control
    window was compared), and the run's (its drift tolerance) for the others."""
    pools = (config.get("calibration") or {}).get("per_pool") or {}
    out = {}
    for pool, c in pools.items():
        tol = c.get("window_tolerance")
        out[pool] = WindowLimits(float(c["drift_tolerance"] if tol is None else tol),
                                 Envelope.from_json(c.get("window_envelope")))
    return out, WindowLimits(thresholds.drift_tolerance)


def _server_acceptance(run_dir: Path) -> dict[str, tuple[int, int]]:
    """Per pool (accepted, drafted) from RUN_DIR/server_counters.json, where the servers count drafts (vLLM)."""
    try:
        counters = json.loads((run_dir / "server_counters.json").read_text())
    except (OSError, ValueError):
        return {}
    return server_acceptance(counters) if isinstance(counters, dict) else {}


def numerics_scales(df, thresholds: GateThresholds, per_pool: dict[str, tuple] | None,
                    calibration: dict[str, dict] | None) -> dict[str, NumericsScale]:
    """Each gated pool's measured numerics (reports/numerics.py): its drift tolerance from `per_pool` (else the
    run's), its controls' figures from `calibration` (config.json `calibration.per_pool`)."""
    gated = df.loc[~df["pool"].map(is_control).astype(bool), ["pool", "restored", "class", "drift_before_flip"]] \
        if len(df) else df
    tolerances = {p: float(limits[1]) for p, limits in (per_pool or {}).items()}
    return pool_scales(gated, tolerances, thresholds.drift_tolerance, calibration) if len(gated) else {}


def judge(df, facts: TokenFacts, thresholds: GateThresholds, calibrated: bool,
          per_pool: dict[str, tuple] | None, restore_tolerances: dict[str, float] | None = None,
          counted: dict[str, tuple[int, int]] | None = None, calibration: dict[str, dict] | None = None,
          trusted: str | None = None) -> tuple[Verdict, list[str], pd.DataFrame]:
    """The verdict on the gated pools of a requests frame (calibration controls are not gated), the path-numerics
    lines (reports/controls.py; in a calibrated run only: the fp32 built-in engine is exact), and the frame as
    judged (path-numerics rows of gated pools have class `path_numerics`, and `unjudged_pool` says whether their
    pool has no control of its path; controls as analyzed). `facts`: what
    the checks past the oracle read from the token lists (reports/facts.py); `counted`: the servers' draft
    acceptance per pool (reports/exercised.py server_acceptance), where no record reports it; `calibration`: the
    calibration's entry per pool (config.json `calibration.per_pool`: its controls, their largest drift), which
    says which pools no control shares a path with (reports/controls.py unshared_pools), and its controls' flips
    per sweep point, which the flip-rate tests (reports/flip_rates.py) compare each pool with; `trusted`: the
    trusted run they come from (--baseline-run)."""
    control = df["pool"].map(is_control).astype(bool) if len(df) else pd.Series([], dtype=bool)
    scales = numerics_scales(df, thresholds, per_pool, calibration)
    gated = with_decisive_flips(df[~control], scales)  # a flip no measured numerics explain is never soft ...
    beyond = decisive(gated, scales)
    unshared = unshared_pools(gated, calibration or {}) if calibrated and len(gated) else {}
    # ... nor path numerics, whatever its pool restored or shares with a control
    mask = path_numerics(gated, unshared) & ~beyond if calibrated else pd.Series(False, index=gated.index)
    lines = []
    if mask.any():
        lines = path_numerics_lines(gated, mask, {p: limits[1] for p, limits in (per_pool or {}).items()},
                                    facts, unshared)
        gated = gated.assign(**{"class": gated["class"].where(~mask, "path_numerics")})
    if calibrated:  # the restore moved the first token: drift, whatever the turn's tolerance
        gated = with_restore_onsets(gated, facts, restore_tolerances or {})
    found = unexercised(gated, facts, thresholds.min_coverage, counted)
    verdict = evaluate(gated, thresholds, [u.text() for u in found] + lines, int(mask.sum()),
                       decisive_lines(gated, beyond, scales), rate_tests(gated, calibration, trusted))
    judged = set(gated.loc[gated["class"].isin(FLAGGED), "pool"].astype(str)) if len(gated) else set()
    gated = gated.assign(unjudged_pool=gated["pool"].astype(str).isin(set(unshared) - judged))
    return verdict, lines, rejoined(df, gated, control) if len(df) else df


def rejoined(df: pd.DataFrame, part: pd.DataFrame, control: pd.Series) -> pd.DataFrame:
    """`pd.concat([part, df[control]]).loc[df.index]` (`part`: the rows of `df` outside `control`, some columns
    changed or added), holding a copy of only the columns `part` changed: the others are `df`'s own."""
    if not df.columns.isin(part.columns).all():  # a column dropped: what concat makes of it
        return pd.concat([part, df[control]]).loc[df.index]
    changed = [c for c in part.columns if c not in df.columns or not part[c].equals(df[c][~control])]
    out = df.copy(deep=False)
    if changed:
        whole = pd.concat([part[changed], df.loc[control, [c for c in changed if c in df.columns]]]).loc[df.index]
        for c in changed:
            out[c] = whole[c]
    return out[list(part.columns)]


def _with_paired(run_dir: Path, df: pd.DataFrame, config: dict) -> pd.DataFrame:
    """`df` with the restored turns that moved from their trusted twins (reports/paired.py) as drift, where the run
    was calibrated against a trusted run (`--baseline-run`) that is still there; config["paired"] says what the
    check found (or why it did not run)."""
    trusted = (config.get("calibration") or {}).get("baseline_run")
    if not trusted or not len(df):
        return df
    if not (Path(trusted) / "records").is_dir():
        config["paired"] = f"not run: the trusted run {trusted} is gone (no records there)"
        return df
    gated = {str(p) for p in df["pool"].dropna().unique() if not is_control(p)}
    found = paired_check(run_dir, trusted, gated)
    config["paired"] = found.text()
    moved = df["key"].astype(str).map(found.flagged)
    hit = moved.notna() & df["class"].isin(["exact", "soft"])
    if not hit.any():
        return df
    return df.assign(**{"class": df["class"].where(~hit, "drift"), "detail": df["detail"].where(~hit, moved)})


def _case_records(run_dir: Path, df: pd.DataFrame) -> tuple[dict, dict]:
    """The records the report shows whole: its worst cases' candidates and their references, read back from the
    run directory (records/reader.py `find`)."""
    cases = worst_cases(df) if len(df) else df
    if not len(cases):
        return {}, {}
    reader = RunReader(run_dir)
    whole = reader.find("key", cases["key"].astype(str), "candidate")
    references = reader.find("input_hash", cases["input_hash"].astype(str), "reference")
    return whole, references


def render_run(run_dir: str | Path, thresholds: GateThresholds | None = None,
               per_pool: dict[str, tuple] | None = None, cluster: str | None = None) -> Verdict:
    """Write requests/boundaries/configs.csv, plots/*.png, report.html, summary.md and junit.xml; return the verdict.

    Thresholds default to config.json's (top-level keys, then its `gate` object), then to GateThresholds();
    `per_pool` (a pool's own margin threshold and drift tolerance) to config.json's calibration. The records are
    streamed (reports/analyze_run.py): what is held is the requests frame, each candidate's latency figures and
    the worst cases' records, never the token lists or the record dicts of the whole run. `cluster`: the token
    pass as Ray tasks on this Ray cluster (an address, auto, or local: reports/analyze_pass.py), the same outputs.
    """
    run_dir = Path(run_dir)
    config = load_config(run_dir)
    if thresholds is None:
        thresholds = GateThresholds.from_config(config)
    calibrated = bool((config.get("calibration") or {}).get("per_pool") is not None or per_pool)
    per_pool = per_pool if per_pool is not None else _per_pool(config)
    run = analyze_run(run_dir, threshold=thresholds.margin_threshold, tolerance=thresholds.drift_tolerance,
                      per_pool=per_pool, cluster=cluster)
    if not run.n_candidates:
        raise NoRecordsError(f"{run_dir} has no candidate records (looked in {run_dir / 'records'})")
    config.setdefault("run_id", run.run_id or run_dir.name)
    config["incidents"] = load_incidents(run_dir)  # replica failures, shown by reports/incidents.py

    # before the tables, so that requests.csv and every table count them as the verdict does
    df = with_windows(run.df, run.facts, *_window_limits(config, thresholds))
    run.df = None  # not read again: the columns the stages below replace are freed as they go
    release()
    config["windows"] = window_lines(df.loc[~df["pool"].map(is_control), [c for c in WINDOW_READS if c in df]],
                                     unprobed_reason(config))
    if calibrated:
        df = with_restore_onsets(df, run.facts, _restore_tolerances(config))
        df = _with_paired(run_dir, df, config)
    calibration = (config.get("calibration") or {}).get("per_pool")
    if calibration and not (config.get("calibration") or {}).get("baseline_run"):
        calibration = with_control_flips(calibration, df)
    df = with_decisive_flips(df, numerics_scales(df, thresholds, per_pool, calibration))
    tables = write_tables(df, run_dir, run.stats, shapes=run.shapes, latency=run.latency)
    run.shapes = run.latency = None
    release()
    floor = noise_floor(df.loc[~df["pool"].map(is_control), ["class", "oracle", "cached_tokens", "drift"]],
                        thresholds.drift_tolerance)
    verdict, _, judged = judge(df, run.facts, thresholds, calibrated, per_pool, _restore_tolerances(config),
                               _server_acceptance(run_dir), calibration,
                               (config.get("calibration") or {}).get("baseline_run"))
    release()
    records, references = _case_records(run_dir, df)
    results = RunResults(df=df, boundaries=tables["boundaries"], configs=tables["configs"],
                         verdict=verdict, config=config, records=records, references=references,
                         coverage=tables["coverage"], tree_shapes=tables["tree_shapes"],
                         diagnosis=diagnose(judged, verdict.rate_findings), floor=floor, judged=judged,
                         warnings=_warnings(run, df) + floor.warnings(calibrated=calibrated), cache_lost=run.cache_lost)
    release()
    results.plots = write_plots(df, results.boundaries, results.configs, run_dir / "plots", results.coverage,
                                thresholds.drift_tolerance)
    release()
    write_html(run_dir / "report.html", results)
    release()
    (run_dir / "summary.md").write_text(render_summary(results), encoding="utf-8")
    release()
    write_junit(df, run_dir / "junit.xml", run_id=results.run_id, verdict=results.verdict)
    for w in results.warnings:
        print(f"warning: {w}", file=sys.stderr)
    return results.verdict


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reports.render", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a run directory (runs/<run-id>) holding records/*.jsonl")
    parser.add_argument("--margin-threshold", type=float, help="soft flip if the reference margin is below this")
    parser.add_argument("--max-soft-rate", type=float, help="largest passing share of soft flips (0.02 = 2%%)")
    parser.add_argument("--max-hard", type=int, help="largest passing number of hard mismatches")
    parser.add_argument("--max-errors", type=int, help="largest passing number of request errors")
    parser.add_argument("--drift-tolerance", type=float, help="largest log-prob drift that counts as numerics")
    parser.add_argument("--max-drift", type=int, help="largest passing number of requests with drift")
    parser.add_argument("--min-coverage", type=float, help="smallest share of boundary cells crossed and restored "
                        "(below it: INCONCLUSIVE)")
    parser.add_argument("--cluster", metavar="ADDRESS", help="analyze with Ray tasks on this Ray cluster (auto: the "
                        "one this node runs; local: a Ray of this machine); its nodes must read the run directory")
    args = parser.parse_args(argv)
    thresholds = GateThresholds.from_config(
        load_config(args.run_dir), margin_threshold=args.margin_threshold,
        max_soft_rate=args.max_soft_rate, max_hard=args.max_hard, max_errors=args.max_errors,
        drift_tolerance=args.drift_tolerance, max_drift=args.max_drift, min_coverage=args.min_coverage)
    try:
        verdict = render_run(args.run_dir, thresholds, cluster=args.cluster)
    except NoRecordsError as e:
        print(f"error: {e}; nothing to judge (exit {EXIT_HARNESS_FAILED})", file=sys.stderr)
        return EXIT_HARNESS_FAILED
    print(verdict.headline)
    for reason in verdict.reasons + verdict.unexercised:
        print(f"  - {reason}")
    print(f"report: {args.run_dir / 'report.html'}")
    return verdict.exit_code


if __name__ == "__main__":
    sys.exit(main())
