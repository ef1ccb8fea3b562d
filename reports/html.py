"""report.html: one self-contained page (inline CSS, PNGs as base64) that answers first: the verdict, then where
the flagged requests are (reports/html_where.py: which restore kinds and boundary cells flagged against which
stayed exact, the most likely subsystem, links to the worst cases), then contents and the details.

Sections are built in reports/html_sections.py, the worst cases in reports/html_cases.py, latency in
reports/html_latency.py, shared pieces (style, escaping, tables) in reports/html_base.py.
"""

from __future__ import annotations

import html
from pathlib import Path

from reports.controls import is_control
from reports.deterministic import deterministic_text
from reports.html_base import CSS, esc, plot_img
from reports.html_cases import case_anchor, case_card, case_link_text, worst_cases
from reports.html_latency import latency_section
from reports.html_sections import (
    CONTENTS,
    boundaries_section,
    coverage_section,
    diagnosis_section,
    floor_section,
    key_figures,
    placement_section,
    sweep_section,
    verdict_header,
)
from reports.html_where import where_section
from reports.incidents import incidents_html
from reports.results import RunResults

# figures drawn inside their own section rather than in the plots gallery
SECTION_PLOTS = ("drift_floor", "coverage", "latency_load", "latency_time", "latency_cdf")
FIRST_CASES = 3  # worst cases linked from the first screen


def _plot(results: RunResults, name: str) -> str:
    path = results.plots.get(name)
    return plot_img(Path(path), name.replace("_", " ")) if path else ""


def render_html(results: RunResults) -> str:
    """The self-contained report page."""
    r = results
    df, verdict, config = r.df, r.verdict, r.config
    word = verdict.word
    judged = r.judged if r.judged is not None else df
    gated = judged[~judged["pool"].map(is_control).astype(bool)] if len(judged) else judged
    cases = worst_cases(df) if len(df) else df
    rows = cases.to_dict("records")
    worst = [(case_anchor(i), case_link_text(row)) for i, row in enumerate(rows[:FIRST_CASES])]
    parts = [f"<!doctype html><html lang=en><head><meta charset=utf-8>"
             '<meta name="viewport" content="width=device-width, initial-scale=1">'
             f"<title>specgate {esc(word)}: {esc(config.get('run_id', ''))}</title><style>{CSS}</style></head><body>",
             verdict_header(verdict, config), "<main>",
             where_section(gated, r.diagnosis.headline, worst, verdict.rate_findings),
             key_figures(df, r.configs, verdict), CONTENTS, diagnosis_section(r.diagnosis)]
    if r.warnings:
        parts.append('<div class="warn">' + "<br>".join(esc(w) for w in r.warnings) + "</div>")
    parts.append(incidents_html(r.config, r.cache_lost))
    if (r.config.get("calibration") or {}).get("text"):  # harness/calibrate.py: thresholds from a clean baseline
        parts.append(f"<h2 id=calibration>Calibration</h2><p>{html.escape(r.config['calibration']['text'])}.</p>")
    if deterministic_text(r.config):  # --deterministic: what the servers confirmed, which paths were exact
        parts.append(f"<p><b>Deterministic mode</b>: {html.escape(deterministic_text(r.config))}.</p>")
    if r.config.get("paired"):  # reports/paired.py, with --baseline-run
        parts.append(f"<p>Paired check: {html.escape(r.config['paired'])}.</p>")
    if r.config.get("windows"):  # reports/window.py: the restored turns' prompt tokens past their checkpoint
        parts.append("<p>Restore windows: " + "<br>".join(html.escape(w) for w in r.config["windows"]) + ".</p>")
    parts += [floor_section(r.floor, _plot(r, "drift_floor")), boundaries_section(r.boundaries),
              coverage_section(r.coverage, _plot(r, "coverage"), r.tree_shapes), sweep_section(r.configs),
              latency_section(r.configs, "".join(_plot(r, n) for n in ("latency_time", "latency_cdf",
                                                                        "latency_load"))),
              placement_section(r.config), "<h2 id=plots>Plots</h2>"]
    for name, path in r.plots.items():
        if name not in SECTION_PLOTS:
            parts.append(plot_img(Path(path), name.replace("_", " ")))
    parts.append(f"<h2 id=cases>Worst cases ({len(cases)})</h2>")
    if not len(cases):
        parts.append("<p>Every request matched its reference exactly, with no drift.</p>")
    tolerance = verdict.thresholds.drift_tolerance
    for i, row in enumerate(rows):
        cand = r.records.get(row["key"], {})
        parts.append(case_card(row, cand, r.references.get(str(row["input_hash"])), tolerance, case_anchor(i)))
    parts.append("</main></body></html>")
    return "\n".join(parts)


def write_html(path: str | Path, results: RunResults) -> Path:
    """Render and write report.html."""
    Path(path).write_text(render_html(results), encoding="utf-8")
    return Path(path)
