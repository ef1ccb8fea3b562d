"""Every output format escapes for itself (issue 27): hostile text from a server or a workload in every field
that reaches a report stays literal in summary.md, junit.xml, the CSV tables and report.html."""

from __future__ import annotations

import csv
import html.parser
import json
import xml.etree.ElementTree as ET

import pytest

from reports.escape import csv_cell, md_inline, xml_safe
from reports.render import render_run
from tests.reports.factory import pair, write_run

# newlines that would start a heading and a table row, raw HTML with a handler, control bytes XML forbids,
# a spreadsheet formula, Markdown link and emphasis syntax, backticks
HOSTILE = ("boom\n# HEADING\n| a | b |\n<img src=x onerror=alert(1)>\x01\x08 =HYPERLINK(\"http://x\") "
           "[l](http://x) *e* ``")


def hostile_run(tmp_path):
    records = []
    records += pair(list(range(97, 130)), [100, 101, 102], session_id="=SUM(A1)" + HOSTILE, case_id=HOSTILE,
                    finish_reason=HOSTILE, output_text=HOSTILE, group=HOSTILE, tokenizer=HOSTILE)
    cand, ref = pair(list(range(97, 140)), [100, 101], session_id="s-err")
    cand.update(error="HTTP 500: " + HOSTILE, output_ids=[], output_logprobs=[], output_top_logprobs=[])
    records += [cand, ref]
    run_dir = write_run(tmp_path / "run", records, {"run_id": "hostile"})
    incident = {"role": "candidate", "pool": "i256", "replica_id": "i256-r0", "error": HOSTILE, "recovered": False,
                "reason": HOSTILE, "excerpt": "Traceback\n" + HOSTILE + "\n```\n# not a heading"}
    (run_dir / "incidents.jsonl").write_text(json.dumps(incident) + "\n")
    render_run(run_dir)
    return run_dir


def outside_fences(lines: list[str]) -> list[str]:
    """The Markdown lines that are not inside a fenced code block (whose text is literal)."""
    out, fence = [], None
    for x in lines:
        mark = x.strip()
        if fence is None and mark.startswith("```"):
            fence = mark
        elif fence is not None and mark == fence:
            fence = None
        elif fence is None:
            out.append(x)
    return out


def test_summary_md_keeps_hostile_text_on_its_own_line(tmp_path):
    text = (hostile_run(tmp_path) / "summary.md").read_text()
    lines = outside_fences(text.splitlines())
    headings = [x for x in lines if x.lstrip().startswith("#")]  # the report's own only
    assert headings == ["# specgate hostile: **FAIL**", "## Sweep points", "## First failing requests",
                        "## Replica incidents (1)"]
    assert not any(x.lstrip().startswith("<") for x in lines)
    assert not any("<img" in x.replace("\\<img", "") for x in lines)  # every '<' of the hostile text is escaped
    assert "HTTP 500: boom \\# HEADING \\| a \\| b \\| \\<img" in text
    # control bytes made visible (and the backslash of the escape escaped for Markdown, so it renders as \x01)
    assert "\x01" not in text and "\x08" not in text and "\\\\x01\\\\x08" in text
    table_rows = [x for x in lines if x.startswith("| a |") or x.startswith("| a | b |")]
    assert table_rows == []
    # the fenced excerpt stays inside its fence: a longer fence than the ``` inside it
    fence_lines = [x.strip() for x in text.splitlines() if x.strip().startswith("```")]
    assert fence_lines == ["````", "```", "````"]


def test_junit_xml_is_well_formed_whatever_bytes_a_server_sends(tmp_path):
    path = hostile_run(tmp_path) / "junit.xml"
    root = ET.parse(path).getroot()  # raises on an ill-formed document
    errors = root.findall(".//error")  # the failed request: a testcase in error, its server's bytes made safe
    assert len(errors) == 1 and "\\x01\\x08" in errors[0].get("message")
    names = {c.get("name") for c in root.iter("testcase")}
    assert any(n.startswith("=SUM(A1)" + xml_safe(HOSTILE) + "/") for n in names)


def test_csv_cells_hold_hostile_text_and_formulas_are_quoted(tmp_path):
    run_dir = hostile_run(tmp_path)
    with open(run_dir / "requests.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2  # line breaks inside a cell did not make rows
    by_session = {r["session_id"]: r for r in rows}
    assert "'=SUM(A1)" + HOSTILE in by_session
    assert by_session["s-err"]["error"] == "HTTP 500: " + HOSTILE


class _Tags(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.handlers: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.handlers += [f"{tag} {k}" for k, _ in attrs if k.startswith("on")]


def test_report_html_escapes_everything(tmp_path):
    text = (hostile_run(tmp_path) / "report.html").read_text()
    parser = _Tags()
    parser.feed(text)
    assert parser.handlers == []
    assert "&lt;img src=x onerror=alert(1)&gt;" in text


@pytest.mark.parametrize(("raw", "escaped"), [
    ("a\nb", "a b"), ("# h", "\\# h"), ("- item", "\\- item"), ("1. item", "\\1. item"), ("<b>", "\\<b\\>"),
    ("a|b", "a\\|b"), ("*x* _y_", "\\*x\\* \\_y\\_"), ("\x01", "\\\\x01"), ("[t](u)", "\\[t\\](u)"),
    ("plain text, 0.5 (ok)", "plain text, 0.5 (ok)"),
])
def test_md_inline(raw, escaped):
    assert md_inline(raw) == escaped


def test_xml_safe_and_csv_cell():
    assert xml_safe("a\x00b\x1fc\td\ufffe") == "a\\x00b\\x1fc\td\\ufffe"
    assert [csv_cell(v) for v in ("=1+1", "+1", "-x", "@a", "ok", 3, None)] == [
        "'=1+1", "'+1", "'-x", "'@a", "ok", 3, None]
