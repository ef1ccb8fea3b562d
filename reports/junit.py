"""junit.xml: a testsuite per sweep point of each gated pool, a testcase per request (one turn of a session), and
a testcase for the run as a whole.

A request's testcase fails where the verdict flags it (hard mismatch, drift) and errs where the request failed, so
junit.xml's failures and errors are the verdict's flagged and failed requests: the counts of the terminal's
`FAIL: 9 hard mismatches, 21 drift (30/74 requests), 0 errors` line and of report.html. A soft flip passes, with
its text on system-out. The `specgate.run` testcase holds the verdict and its reasons; it fails only where the
gate did not pass and no request's testcase says so (a soft-flip rate over the limit, INCONCLUSIVE), so a
pipeline that reads junit.xml never passes a run the gate failed. A calibration control is never a testcase (it
is not judged).
"""

from __future__ import annotations

import shutil
import tempfile
import xml.etree.ElementTree as ET
from array import array
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from records.schema import point_label
from reports.controls import is_control
from reports.escape import xml_safe
from reports.results import case_text, value_or_none

VERDICT_SUITE = "specgate"


def sweep_point(pool, concurrency, key=None) -> str:
    """The JUnit classname of a sweep point, e.g. `i256.c4`, or `i256.r2.5` for an open-loop one (from the
    record's key: open-loop points have no concurrency)."""
    label = point_label({"key": key, "pool": pool})
    if label:
        return xml_safe(f"{pool}.{label}")
    conc = value_or_none(concurrency)
    return xml_safe(f"{pool}.c{conc}" if conc is not None else str(pool))


_BRIEF = ["key", "pool", "concurrency", "session_id", "turn", "e2e", "class"]


def _points(df: pd.DataFrame) -> dict[str, array]:
    """sweep point -> the positions of its requests in `df`, in frame order."""
    points: dict[str, array] = {}
    for i, (pool, concurrency, key) in enumerate(zip(df["pool"], df["concurrency"], df["key"], strict=True)):
        points.setdefault(sweep_point(pool, concurrency, key), array("q")).append(i)
    return points


def _rows(df: pd.DataFrame) -> list[dict]:
    """The requests of one sweep point: the few columns a testcase needs, and whole rows (as to_dict gives them)
    only for the requests whose text is written (hard, drift, error, soft)."""
    cols = {c: df[c].tolist() for c in _BRIEF}
    texts = [i for i, c in enumerate(cols["class"]) if c in ("hard", "drift", "error", "soft")]
    whole = dict(zip(texts, df.iloc[texts].to_dict("records"), strict=True)) if texts else {}
    return [whole.get(i) or {c: cols[c][i] for c in _BRIEF} for i in range(len(df))]


def _counts(r: dict) -> tuple[int, int, float]:
    """(failures, errors, seconds) one request's testcase adds."""
    return int(r["class"] in ("hard", "drift")), int(r["class"] == "error"), value_or_none(r["e2e"]) or 0.0


def _case(suite: ET.Element, classname: str, r: dict) -> None:
    """One request's testcase."""
    name = xml_safe(f"{r['session_id']}/{value_or_none(r['turn'])}")
    case = ET.SubElement(suite, "testcase", classname=classname, name=name, time=f"{_counts(r)[2]:.3f}")
    if r["class"] in ("hard", "drift"):
        failure = ET.SubElement(case, "failure", type=r["class"], message=xml_safe(case_text(r)))
        failure.text = xml_safe(f"{r['key']}: {case_text(r)}")
        return
    if r["class"] == "error":
        error = ET.SubElement(case, "error", type="error", message=xml_safe(case_text(r)))
        error.text = xml_safe(f"{r['key']}: {case_text(r)}")
        return
    out = f"{r['key']}: {r['class']}"
    if r["class"] == "soft":
        out += f"\nsoft flip (numerics; counted in the soft-flip rate): {case_text(r)}"
    ET.SubElement(case, "system-out").text = xml_safe(out)


def _verdict_suite(root: ET.Element, verdict, requests_failed: bool) -> int:
    """The testsuite holding the run's verdict; the failures it adds (1 where the gate did not pass and no request's
    testcase failed)."""
    suite = ET.SubElement(root, "testsuite", name=VERDICT_SUITE, tests="1", errors="0", time="0.000")
    case = ET.SubElement(suite, "testcase", classname=VERDICT_SUITE, name="run", time="0.000")
    lines = [verdict.headline, *verdict.reasons, *(f"not exercised: {u}" for u in verdict.unexercised)]
    failed = verdict.word != "PASS" and not requests_failed
    if failed:
        failure = ET.SubElement(case, "failure", type=verdict.word, message=xml_safe(verdict.headline))
        failure.text = xml_safe("\n".join(lines))
    else:
        ET.SubElement(case, "system-out").text = xml_safe("\n".join(lines))
    suite.set("failures", str(int(failed)))
    return int(failed)


def _suites(df: pd.DataFrame) -> Iterator[tuple[ET.Element, list[dict], int, int, float]]:
    """(testsuite with its totals and no testcase yet, its requests' rows in testcase order, failures, errors,
    seconds) per sweep point of the gated pools, in classname order, one at a time."""
    # Every attribute and text goes through xml_safe: a server's control bytes must not make the file ill-formed.
    gated = (~df["pool"].map(is_control).astype(bool)).to_numpy(dtype=bool) if len(df) else np.zeros(0, bool)
    where = np.flatnonzero(gated)  # the gated rows' positions in df (a copy of their rows would be most of df)
    points = _points(df.loc[gated, ["pool", "concurrency", "key"]]) if len(where) else {}
    for classname in sorted(points):
        rows = sorted(_rows(df.iloc[where[np.asarray(points.pop(classname))]]),
                      key=lambda r: (str(r["session_id"]), value_or_none(r["turn"]) or 0))
        counts = [0, 0, 0.0]
        for r in rows:
            f, e, t = _counts(r)
            counts = [counts[0] + f, counts[1] + e, counts[2] + t]
        suite = ET.Element("testsuite", name=classname)
        suite.attrib.update(tests=str(len(rows)), failures=str(counts[0]), errors=str(counts[1]),
                            time=f"{counts[2]:.3f}")
        yield suite, rows, counts[0], counts[1], counts[2]


_CASES_AT_ONCE = 4096  # testcases serialized at once: a sweep point's whole tree is ~3 KB a request


def _suite_text(suite: ET.Element, rows: list[dict]) -> Iterator[str]:
    """The testsuite as ET.indent(suite, level=1) and ET.tostring write it with a testcase per row, in pieces of
    _CASES_AT_ONCE testcases."""
    suite.text = "\x00"  # where the testcases go
    start, end = ET.tostring(suite, encoding="unicode").split("\x00")
    yield start
    classname = suite.get("name")
    for at in range(0, len(rows), _CASES_AT_ONCE):
        holder = ET.Element("testsuite")
        for r in rows[at:at + _CASES_AT_ONCE]:
            _case(holder, classname, r)
        ET.indent(holder, level=1)  # each testcase's text and tails as they are in the whole suite ...
        if at == 0:
            yield holder.text
        if at + _CASES_AT_ONCE < len(rows):  # ... but the last one's tail, where more follow
            holder[-1].tail = holder.text
        yield "".join(ET.tostring(case, encoding="unicode") for case in holder)
    yield end


def junit_tree(df: pd.DataFrame, run_id: str = "specgate", verdict=None) -> ET.ElementTree:
    """Build the JUnit tree: a testsuite per sweep point of each gated pool with a testcase per request, and (given
    the verdict) the `specgate` suite with the verdict's testcase."""
    root = ET.Element("testsuites", name=xml_safe(f"specgate {run_id}"))
    tests = failures = errors = 0
    total_time = 0.0
    for suite, rows, f, e, t in _suites(df):
        for r in rows:
            _case(suite, suite.get("name"), r)
        root.append(suite)
        tests, failures, errors, total_time = tests + len(rows), failures + f, errors + e, total_time + t
    if verdict is not None:
        failures += _verdict_suite(root, verdict, failures + errors > 0)
        tests += 1
    root.attrib.update(tests=str(tests), failures=str(failures), errors=str(errors), time=f"{total_time:.3f}")
    ET.indent(root)
    return ET.ElementTree(root)


def write_junit(df: pd.DataFrame, path: str | Path, run_id: str = "specgate", verdict=None) -> Path:
    """Write junit.xml for the requests frame (and the run's verdict): junit_tree's file, each testsuite written
    _CASES_AT_ONCE testcases at a time (a tree of every request's testcase is ~1 KB a request, a sweep point's
    can be most of a run) to a temporary file, then put under the root whose totals they give."""
    tests = failures = errors = 0
    total_time = 0.0
    with tempfile.TemporaryFile("w+", encoding="utf-8") as body:
        for suite, rows, f, e, t in _suites(df):
            body.write(_SEP)
            for piece in _suite_text(suite, rows):
                body.write(piece)
            tests, failures, errors, total_time = tests + len(rows), failures + f, errors + e, total_time + t
        if verdict is not None:
            holder = ET.Element("testsuites")
            failures += _verdict_suite(holder, verdict, failures + errors > 0)
            tests += 1
            ET.indent(holder[0], level=1)
            body.write(_SEP + ET.tostring(holder[0], encoding="unicode"))
        root = ET.Element("testsuites", name=xml_safe(f"specgate {run_id}"))
        root.attrib.update(tests=str(tests), failures=str(failures), errors=str(errors), time=f"{total_time:.3f}")
        with open(path, "w", encoding="utf-8") as out:
            out.write("<?xml version='1.0' encoding='utf-8'?>\n")
            if not body.tell():  # no testsuite at all: an empty root
                out.write(ET.tostring(root, encoding="unicode"))
                return Path(path)
            root.text = "\x00"  # where the testsuites go
            start, end = ET.tostring(root, encoding="unicode").split("\x00")
            body.seek(0)
            out.write(start)
            shutil.copyfileobj(body, out)
            out.write("\n" + end)
    return Path(path)


_SEP = "\n  "  # before each testsuite (ET.indent's, one level down)
