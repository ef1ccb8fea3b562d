"""summary.md: the verdict and the key figures, for a CI job summary or a PR comment."""

from __future__ import annotations

import pandas as pd

from reports.incidents import code_span, incidents_markdown
from reports.results import RunResults, case_text


def _md_table(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df.to_dict("records"):
        cells = []
        for c in cols:
            v = r[c]
            cells.append("" if pd.isna(v) else (f"{v:.4g}" if isinstance(v, float) else str(v)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_summary(results: RunResults, report_path: str = "report.html") -> str:
    """Markdown: verdict, reasons, counts, the boundary rows with mismatches, the sweep points, the first cases."""
    df, boundaries, configs, verdict, config = (results.df, results.boundaries, results.configs, results.verdict,
                                                results.config)
    t = verdict.thresholds
    word = "PASS" if verdict.passed else "FAIL"
    lines = [f"# specgate {config.get('run_id', '')}: **{word}**", "", f"**{verdict.headline}**", ""]
    lines += [f"- {r}" for r in verdict.reasons] or ["- all gate checks passed"]
    lines += ["", f"Gate: hard <= {t.max_hard}, errors <= {t.max_errors}, soft <= {100 * t.max_soft_rate:.1f}% "
              f"of requests; soft = reference top-1/top-2 margin < {t.margin_threshold:g}.", ""]
    lines += ["| requests | exact | soft | hard | errors |", "|---|---|---|---|---|",
              f"| {verdict.requests} | {verdict.exact} | {verdict.soft} | {verdict.hard} | {verdict.errors} |", ""]
    linked = df[df["restored_verify_crossed"]] if len(df) else df
    if len(linked):
        hard = int((linked["class"] == "hard").sum())
        lines += [f"Turns that restored a checkpoint their previous turn crossed inside a verify step: "
                  f"{len(linked)}, of which hard: {hard}.", ""]
    mism = boundaries[(boundaries["hard"] + boundaries["soft"]) > 0] if len(boundaries) else boundaries
    if len(mism):
        lines += ["## Boundaries with mismatches", "", _md_table(mism.head(40)), ""]
    if len(configs):
        cols = ["pool", "interval", "concurrency", "requests", "hard", "soft", "error", "output_tok_s",
                "ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p99_ms", "accept_length_mean"]
        lines += ["## Sweep points", "", _md_table(configs[cols]), ""]
    bad = df[df["class"].isin(["hard", "error"])].head(10) if len(df) else df
    if len(bad):
        lines += ["## First failing requests", ""]
        lines += [f"- {code_span(str(r['key']))}: {case_text(r)}" for r in bad.to_dict("records")]
        lines.append("")
    lines += incidents_markdown(config, results.records)
    lines.append(f"Full report: `{report_path}`")
    return "\n".join(lines) + "\n"
