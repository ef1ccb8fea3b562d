"""junit.xml: one testcase per session per sweep point; hard mismatches, drift and errors fail it."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd

from records.schema import point_label
from reports.escape import xml_safe
from reports.results import case_text, value_or_none


def sweep_point(pool, concurrency, key=None) -> str:
    """The JUnit classname of a sweep point, e.g. `i256.c4`, or `i256.r2.5` for an open-loop one (from the
    record's key: open-loop points have no concurrency)."""
    label = point_label({"key": key, "pool": pool})
    if label:
        return xml_safe(f"{pool}.{label}")
    conc = value_or_none(concurrency)
    return xml_safe(f"{pool}.c{conc}" if conc is not None else str(pool))


_BRIEF = ["key", "pool", "concurrency", "session_id", "turn", "e2e", "class"]


def _points(df: pd.DataFrame) -> dict[str, dict[str, list[dict]]]:
    """sweep point -> session -> its rows: the few columns a testcase needs, and whole rows (as to_dict gives
    them) only for the turns whose text is written (hard, drift, error, soft); the frame is not turned into
    dicts. Grouped in Python: pandas groupby + to_dict per session is ~25 ms a group."""
    points: dict[str, dict[str, list[dict]]] = {}
    if not len(df):
        return points
    cols = {c: df[c].tolist() for c in _BRIEF}
    texts = [i for i, c in enumerate(cols["class"]) if c in ("hard", "drift", "error", "soft")]
    whole = dict(zip(texts, df.iloc[texts].to_dict("records"), strict=True)) if texts else {}
    for i in range(len(df)):
        r = whole.get(i) or {c: cols[c][i] for c in _BRIEF}
        sessions = points.setdefault(sweep_point(r["pool"], r["concurrency"], r["key"]), {})
        sessions.setdefault(str(r["session_id"]), []).append(r)
    return points


def junit_tree(df: pd.DataFrame, run_id: str = "specgate") -> ET.ElementTree:
    """Build the JUnit tree: a testsuite per sweep point, a testcase per session, failures for hard, drift and
    error turns."""
    points = _points(df)
    # Every attribute and text goes through xml_safe: a server's control bytes must not make the file ill-formed.
    root = ET.Element("testsuites", name=xml_safe(f"specgate {run_id}"))
    total_tests = total_failures = 0
    total_time = 0.0
    for classname in sorted(points):
        suite = ET.SubElement(root, "testsuite", name=classname)
        failures = 0
        suite_time = 0.0
        for session in sorted(points[classname]):
            rows = sorted(points[classname][session], key=lambda r: (value_or_none(r["turn"]) or 0))
            time = sum(value_or_none(r["e2e"]) or 0.0 for r in rows)
            case = ET.SubElement(suite, "testcase", classname=classname, name=xml_safe(session), time=f"{time:.3f}")
            bad = [r for r in rows if r["class"] in ("hard", "drift", "error")]
            if bad:
                kinds = sorted({r["class"] for r in bad})
                failure = ET.SubElement(case, "failure", type="+".join(kinds), message=xml_safe(case_text(bad[0])))
                failure.text = xml_safe("\n".join(case_text(r) for r in bad))
                failures += 1
            out = [f"{r['key']}: {r['class']}" for r in rows]
            out += [f"soft flip (not a failure): {case_text(r)}" for r in rows if r["class"] == "soft"]
            ET.SubElement(case, "system-out").text = xml_safe("\n".join(out))
            suite_time += time
        tests = len(points[classname])
        suite.attrib.update(tests=str(tests), failures=str(failures), errors="0", time=f"{suite_time:.3f}")
        total_tests += tests
        total_failures += failures
        total_time += suite_time
    root.attrib.update(tests=str(total_tests), failures=str(total_failures), errors="0", time=f"{total_time:.3f}")
    ET.indent(root)
    return ET.ElementTree(root)


def write_junit(df: pd.DataFrame, path: str | Path, run_id: str = "specgate") -> Path:
    """Write junit.xml for the requests frame."""
    junit_tree(df, run_id).write(path, encoding="utf-8", xml_declaration=True)
    return Path(path)
