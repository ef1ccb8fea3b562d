"""Replica incidents in the report: what failed during the run, and which turns lost their cache.

Reads the incidents (records/incidents.py) attached to the run's config as
`config["incidents"]` by reports/render.py, and the candidate records' `cache_lost`.
A candidate that keeps crashing fails the gate through its failed requests; this
section shows why, with the first lines of the crash from the replica's log.
"""

from __future__ import annotations

import html
from collections import Counter

from reports.escape import md_block_line, md_code_text, md_inline


def _what(i: dict) -> str:
    if i.get("recovered"):
        return f"recovered after {i.get('recovery_s', '?')}s"
    return f"given up: {i.get('reason') or 'did not recover'}"


def incident_lines(incidents: list[dict]) -> list[str]:
    """One line per incident: `[role pool] replica: what failed -> what happened; log PATH`."""
    return [f"[{i.get('role')} {i.get('pool')}] {i.get('replica_id')}: {str(i.get('error') or 'failed')[:160]} -> "
            f"{_what(i)}; log {i.get('log') or 'n/a'}" for i in incidents]


def cache_lost_counts(records) -> Counter:
    """How many candidate turns ran without their previous turn's cache, by cause."""
    return Counter(r.get("cache_lost") for r in records if r.get("cache_lost"))


def _longest_backtick_run(text: str) -> int:
    run = best = 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        best = max(best, run)
    return best


def code_span(text: str) -> str:
    """`text` as a Markdown code span that survives backticks inside it (CommonMark: a longer fence), on one line."""
    text = md_code_text(text)
    fence = "`" * (_longest_backtick_run(text) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def incidents_html(config: dict, lost: Counter) -> str:
    """The report section ('' when nothing happened); `lost`: cache_lost_counts of the candidates."""
    incidents = config.get("incidents") or []
    if not incidents and not lost:
        return ""
    parts = [f"<h2>Replica incidents ({len(incidents)})</h2>"]
    for line, i in zip(incident_lines(incidents), incidents, strict=True):
        parts.append(f"<p>{html.escape(line)}</p>")
        if i.get("excerpt"):
            parts.append(f"<pre>{html.escape(i['excerpt'])}</pre>")
    if lost:
        what = ", ".join(f"{n} after a {cause}" for cause, n in sorted(lost.items()))
        parts.append(f"<p>Turns that ran without the cache their previous turn left (their prefix-cache restore "
                     f"path was not exercised): {html.escape(what)}.</p>")
    return "\n".join(parts)


def incidents_markdown(config: dict, lost: Counter) -> list[str]:
    """summary.md lines ([] when nothing happened); `lost`: cache_lost_counts of the candidates."""
    incidents = config.get("incidents") or []
    if not incidents and not lost:
        return []
    lines = [f"## Replica incidents ({len(incidents)})", ""]
    for line, i in zip(incident_lines(incidents), incidents, strict=True):
        lines.append(f"- {md_inline(line)}")
        if i.get("excerpt"):
            excerpt = str(i["excerpt"])
            fence = "`" * max(3, _longest_backtick_run(excerpt) + 1)
            lines += ["", f"  {fence}", *("  " + md_block_line(x) for x in excerpt.splitlines()), f"  {fence}"]
    if lost:
        lines.append("- turns without their previous turn's cache: "
                     + ", ".join(f"{n} ({cause})" for cause, n in sorted(lost.items())))
    return lines + [""]
