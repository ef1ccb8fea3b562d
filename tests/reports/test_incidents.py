"""Replica incidents and lost caches in report.html and summary.md; Markdown code spans that survive backticks."""

from __future__ import annotations

import pytest

from reports.incidents import cache_lost_counts, code_span, incident_lines, incidents_html, incidents_markdown

CRASH = "Traceback (most recent call last):\n  File \"x.py\", line 1\nRuntimeError: <boom> ``` `x`"
INCIDENTS = [
    {"pool": "i128", "role": "candidate", "replica_id": "i128-r0", "error": "server error 503 mid-stream",
     "recovered": True, "recovery_s": 4.2, "log": "/tmp/specgate/r/i128-r0-1.log", "excerpt": CRASH},
    {"pool": "i128", "role": "candidate", "replica_id": "i128-r0", "error": "ServerDisconnectedError",
     "recovered": False, "reason": "restarts used up", "log": "/tmp/specgate/r/i128-r0-2.log", "excerpt": None},
]
RECORDS = {"a": {"cache_lost": "replica restart"}, "b": {"cache_lost": None}, "c": {"cache_lost": "resume"},
           "d": {"cache_lost": "resume"}}
LOST = cache_lost_counts(RECORDS.values())


@pytest.mark.parametrize("text,want", [
    ("s0/1", "`s0/1`"),
    ("a`b", "``a`b``"),
    ("``x", "``` ``x ```"),
    ("x`", "`` x` ``"),
])
def test_code_span(text, want):
    assert code_span(text) == want


def test_incident_lines_name_replica_outcome_and_log():
    lines = incident_lines(INCIDENTS)
    assert lines[0] == ("[candidate i128] i128-r0: server error 503 mid-stream -> recovered after 4.2s; "
                        "log /tmp/specgate/r/i128-r0-1.log")
    assert "given up: restarts used up" in lines[1] and "i128-r0-2.log" in lines[1]


def test_html_section_escapes_the_crash_and_counts_lost_caches():
    page = incidents_html({"incidents": INCIDENTS}, LOST)
    assert "<h2>Replica incidents (2)</h2>" in page and "RuntimeError: &lt;boom&gt;" in page and "<boom>" not in page
    assert "1 after a replica restart, 2 after a resume" in page
    assert incidents_html({}, cache_lost_counts([{"cache_lost": None}])) == ""


def test_markdown_section_fences_the_crash_beyond_its_backticks():
    lines = incidents_markdown({"incidents": INCIDENTS}, LOST)
    text = "\n".join(lines)
    assert "## Replica incidents (2)" in text and "  ````" in lines  # the excerpt holds ```: a 4-backtick fence
    assert "turns without their previous turn's cache: 1 (replica restart), 2 (resume)" in text
    assert incidents_markdown({}, cache_lost_counts([])) == []
