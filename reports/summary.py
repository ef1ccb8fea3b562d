"""summary.md: the verdict and the key figures, for a CI job summary or a PR comment."""

from __future__ import annotations

import pandas as pd

from reports.controls import is_control
from reports.coverage import coverage_summary
from reports.deterministic import deterministic_text
from reports.escape import md_inline
from reports.flip_rates import family_text, rates_table
from reports.html_sections import cache_pressure_text
from reports.incidents import code_span, incidents_markdown
from reports.results import RunResults, case_text


def _md_table(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df.to_dict("records"):
        cells = []
        for c in cols:
            v = r[c]
            cells.append("" if pd.isna(v) else (f"{v:.4g}" if isinstance(v, float) else md_inline(v)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_summary(results: RunResults, report_path: str = "report.html") -> str:
    """Markdown: verdict, reasons, counts, the boundary rows with mismatches, the sweep points, the first cases."""
    df, boundaries, configs, verdict, config = (results.df, results.boundaries, results.configs, results.verdict,
                                                results.config)
    t = verdict.thresholds
    word = verdict.word
    # Every text that can hold a server's or a workload's words goes through md_inline: it stays one literal line.
    lines = [f"# specgate {md_inline(config.get('run_id', ''))}: **{word}**", "", f"**{md_inline(verdict.headline)}**",
             ""]
    lines += ([f"- {md_inline(r)}" for r in verdict.reasons]
              + [f"- not exercised: {md_inline(u)}" for u in verdict.unexercised]) or ["- all gate checks passed"]
    lines += ["", f"**Diagnosis:** {md_inline(results.diagnosis.headline)}", ""]
    lines += [f"- {md_inline(e)}" for e in results.diagnosis.evidence] + ([""] if results.diagnosis.evidence else [])
    lines += [f"Gate: hard <= {t.max_hard}, drift <= {t.max_drift}, errors <= {t.max_errors}, soft <= "
              f"{100 * t.max_soft_rate:.1f}% of requests; drift = same tokens, log-prob drift > "
              f"{t.drift_tolerance:g}; soft = reference top-1/top-2 margin < {t.margin_threshold:g}, no drift "
              "before or at it, within twice what the path's numerics move a log-prob.", ""]
    if (config.get("calibration") or {}).get("text"):
        lines += [f"Calibration: {md_inline(config['calibration']['text'])}.", ""]
    if deterministic_text(config):  # --deterministic
        lines += [f"Deterministic mode: {md_inline(deterministic_text(config))}.", ""]
    lines += [f"Flip rates: {md_inline(family_text(verdict.rate_tests))}.", ""]
    table = rates_table(verdict.rate_tests)
    if len(table):  # reports/flip_rates.py: the tests that can reach the level, both rates side by side
        lines += [_md_table(table), ""]
    if config.get("paired"):  # reports/paired.py, with --baseline-run
        lines += [f"Paired check: {md_inline(config['paired'])}.", ""]
    if config.get("windows"):  # reports/window.py: the restored turns' prompt tokens past their checkpoint
        lines += [f"Restore windows: {md_inline(w)}." for w in config["windows"]] + [""]
    lines += ["| requests | exact | drift | soft | hard | errors |", "|---|---|---|---|---|---|",
              f"| {verdict.requests} | {verdict.exact} | {verdict.drift} | {verdict.soft} | {verdict.hard} | "
              f"{verdict.errors} |", ""]
    floor = results.floor
    if floor.max is not None:
        lines += [f"Noise floor: requests that restored nothing ({floor.requests}) drift by at most "
                  f"{floor.max:.3g} (tolerance {floor.tolerance:g}).", ""]
    lines += [f"Warning: {md_inline(w)}" for w in results.warnings]
    # the gated pools (a control is never judged), as a mask: a copy of their rows is a copy of the frame
    gated = ~df["pool"].map(is_control).astype(bool) if len(df) else pd.Series([], dtype=bool)
    linked = df.loc[gated & df["restored_verify_crossed"], ["class"]] if len(df) else df
    if len(linked):
        flagged = int(linked["class"].isin(["hard", "drift"]).sum())
        lines += [f"Turns that restored a checkpoint their previous turn crossed inside a verify step: "
                  f"{len(linked)}, of which flagged (hard or drift): {flagged}.", ""]
    linked = df.loc[gated & (df["restored_link"] == "position"), ["class"]] if len(df) else df
    if len(linked):
        flagged = int(linked["class"].isin(["hard", "drift"]).sum())
        lines += [f"Turns that restored a checkpoint their previous turn crossed (position-linked: the engine does "
                  f"not report verify steps, so which step crossed it is unknown): {len(linked)}, of which flagged "
                  f"(hard or drift): {flagged}.", ""]
    for s in coverage_summary(results.coverage) if len(results.coverage) else []:
        lines.append(f"Coverage at interval {s['interval']}: {s['crossed']}/{s['cells']} (step, commit length) "
                     f"cells crossed, {s['restored']}/{s['cells']} restored.")
    shapes = results.tree_shapes
    for interval, g in shapes.groupby("interval", sort=True) if len(shapes) else []:
        lines.append(f"Tree shapes at interval {interval} (restored requests, flagged): " + ", ".join(
            f"{r['shape']} {r['requests']} ({r['flagged']})" for r in g.to_dict("records")) + ".")
    if len(configs):
        lines += ["", cache_pressure_text(configs), ""]
    mism = (boundaries[(boundaries["hard"] + boundaries["drift"] + boundaries["soft"]) > 0] if len(boundaries)
            else boundaries)
    if len(mism):
        lines += ["## Boundaries with mismatches", "", _md_table(mism.head(40)), ""]
    if len(configs):
        cols = ["pool", "interval", "concurrency", "requests", "hard", "drift", "soft", "error", "drift_max",
                "cache_hit_tokens", "checkpoint_evictions", "kv_evicted_pages", "cells_crossed", "cells_restored",
                "output_tok_s", "e2e_p50_ms", "accept_length_mean"]
        lines += ["## Sweep points", "", _md_table(configs[cols]), ""]
    bad = df[gated & df["class"].isin(["hard", "drift", "error"])].head(10) if len(df) else df
    if len(bad):
        lines += ["## First failing requests", ""]
        lines += [f"- {code_span(str(r['key']))}: {md_inline(case_text(r))}" for r in bad.to_dict("records")]
        lines.append("")
    lines += incidents_markdown(config, results.cache_lost)
    lines.append(f"Full report: `{report_path}`")
    return "\n".join(lines) + "\n"
