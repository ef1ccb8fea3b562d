"""junit.xml: one testcase per session per sweep point; hard mismatches and errors fail it."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd

from reports.describe import case_text, value_or_none


def sweep_point(pool, concurrency) -> str:
    """The JUnit classname of a sweep point, e.g. `i256.c4`."""
    conc = value_or_none(concurrency)
    return f"{pool}.c{conc}" if conc is not None else str(pool)


def junit_tree(df: pd.DataFrame, run_id: str = "specgate") -> ET.ElementTree:
    """Build the JUnit tree: a testsuite per sweep point, a testcase per session, failures for hard/error turns."""
    root = ET.Element("testsuites", name=f"specgate {run_id}")
    totals = {"tests": 0, "failures": 0}
    total_time = 0.0
    if len(df):
        groups = df.sort_values(["pool", "concurrency", "session_id", "turn"]).groupby(
            ["pool", "concurrency"], dropna=False, sort=False)
    else:
        groups = []
    for (pool, conc), point in groups:
        classname = sweep_point(pool, conc)
        suite = ET.SubElement(root, "testsuite", name=classname)
        tests = failures = 0
        suite_time = 0.0
        for session, turns in point.groupby("session_id", sort=False, dropna=False):
            rows = turns.to_dict("records")
            time = float(pd.to_numeric(turns["e2e"], errors="coerce").fillna(0).sum())
            case = ET.SubElement(suite, "testcase", classname=classname, name=str(session), time=f"{time:.3f}")
            bad = [r for r in rows if r["class"] in ("hard", "error")]
            if bad:
                first = bad[0]
                kinds = sorted({r["class"] for r in bad})
                failure = ET.SubElement(case, "failure", type="+".join(kinds),
                                        message=case_text(first))
                failure.text = "\n".join(case_text(r) for r in bad)
                failures += 1
            soft = [r for r in rows if r["class"] == "soft"]
            out = [f"{r['key']}: {r['class']}" for r in rows] + [f"soft flip (not a failure): {case_text(r)}"
                                                                   for r in soft]
            ET.SubElement(case, "system-out").text = "\n".join(out)
            tests += 1
            suite_time += time
        suite.set("tests", str(tests))
        suite.set("failures", str(failures))
        suite.set("errors", "0")
        suite.set("time", f"{suite_time:.3f}")
        totals["tests"] += tests
        totals["failures"] += failures
        total_time += suite_time
    root.set("tests", str(totals["tests"]))
    root.set("failures", str(totals["failures"]))
    root.set("errors", "0")
    root.set("time", f"{total_time:.3f}")
    ET.indent(root)
    return ET.ElementTree(root)


def write_junit(df: pd.DataFrame, path: str | Path, run_id: str = "specgate") -> Path:
    """Write junit.xml for the requests frame."""
    junit_tree(df, run_id).write(path, encoding="utf-8", xml_declaration=True)
    return Path(path)
