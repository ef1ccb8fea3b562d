"""benchmarks/sglang_37817_table.py on a run and a verify trace written here: which verify step crossed a restored
checkpoint, the steps the overlap scheduler ran past a request's end, the restores by kind, the acceptance."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from benchmarks.sglang_37817_table import crossing, read_trace, summarize, table

COLUMNS = ("key", "pool", "session_id", "case_id", "turn", "interval", "input_hash", "class", "cached_tokens",
           "restored_link", "ref_margin", "drift", "prompt_offset", "spec_accept_length", "window_status",
           "window_drift")


def _trace(path, rows):
    path.write_text("noise\n" + "".join(f"[specgate-verify] {json.dumps(r)}\n" for r in rows))
    return str(path)


def _step(h, pre, commit, tracked, prompt_len=120, max_new=24):
    return {"input": h, "rid": "r", "prompt_len": prompt_len, "max_new": max_new, "pre": pre, "commit": commit,
            "tracked": tracked}


def test_steps_past_a_requests_end_are_dropped_and_crossings_found(tmp_path):
    log = _trace(tmp_path / "c.log", [_step("a", 120, 3, -1), _step("a", 123, 8, -1), _step("a", 131, 8, -1),
                                      _step("a", 143, 1, -1), _step("p", 152, 1, -1, 152, 1)])
    trace = read_trace([log, None, str(tmp_path / "missing.log")])
    assert [(r["pre"], r["commit"]) for r in trace["a"]] == [(120, 3), (123, 8), (131, 8)]  # 143 >= 120 + 24 - 1
    assert "p" not in trace  # a one-token probe produces its token in prefill: its verify step is the overlap's
    assert crossing(trace, "a", 128) == {"pre": 123, "commit": 8, "step": 4, "tracked": -1}
    assert crossing(trace, "a", 123) == {"pre": 120, "commit": 3, "step": 2, "tracked": -1}
    assert crossing(trace, "a", 256) is None and crossing(trace, "zz", 128) is None


def test_a_trace_error_is_not_read_as_a_short_trace(tmp_path):
    (tmp_path / "c.log").write_text("[specgate-verify-error] KeyError('x')\n")
    with pytest.raises(ValueError, match="the verify trace failed"):
        read_trace([str(tmp_path / "c.log")])


def _run(tmp_path, name, classes, windows):
    """A two-session run: session s1 restores 128 crossed by its turn 0's verify step, s2 a prefill checkpoint."""
    run = tmp_path / name
    run.mkdir()
    rows = [("i128-c1/s1/0", "i128", "s1", "s1", 0, 128, "a", classes[0], 0, None, None, 0.0, -8, 2.0, None, None),
            ("i128-c1/s1/1", "i128", "s1", "s1", 1, 128, "b", classes[1], 128, "position", 0.2, 0.05, 24, 3.0,
             windows[0], 0.04),
            ("i128-c1/s2/0", "i128", "s2", "s2", 0, 128, "c", "exact", 0, None, None, 0.0, 40, 2.5, None, None),
            ("i128-c1/s2/1", "i128", "s2", "s2", 1, 128, "d", "exact", 128, "prefill", None, 0.0, 78, 2.5,
             windows[1], 1e-6)]
    pd.DataFrame(rows, columns=COLUMNS).to_csv(run / "requests.csv", index=False)
    (run / "summary.md").write_text("# x\n\n**FAIL: 1 drift**\n")
    return run


def test_summaries_and_the_table(tmp_path):
    log = _trace(tmp_path / "u.log", [_step("a", 120, 3, -1), _step("a", 123, 8, -1), _step("b", 150, 4, -1, 150, 32)])
    u = summarize(_run(tmp_path, "u", ["exact", "drift"], ["flagged", "compared"]), 1, [log])
    log_p = _trace(tmp_path / "p.log", [_step("a", 120, 3, -1), _step("a", 123, 8, 4), _step("b", 150, 4, -1, 150, 32)])
    p = summarize(_run(tmp_path, "p", ["exact", "exact"], ["compared", "compared"]), 0, [log_p])
    assert (u["verdict"], u["headline"], u["cases"], u["mismatching_cases"]) == ("FAIL", "FAIL: 1 drift", 2, 1)
    assert u["restores"] == {"verify": [1, 1], "prefill": [1, 0], "other": [0, 0], "nothing": [2, 0]}
    assert u["flagged"] == u["verify_restores"] == ["i128-c1/s1/1"]
    assert u["cells"] == [[4, 8, -1, 1, 1]] and p["cells"] == [[4, 8, 4, 1, 0]]
    assert (u["verify_steps"], u["accepted_drafts"]) == (3, 2 + 7 + 3)
    assert u["windows"]["verify"][:2] == [1, 1] and p["windows"]["verify"][:2] == [0, 1]
    text = table({"unpatched": {"frozen": u}, "patched": {"frozen": p}}, "0.5.19")
    assert "mismatching cases" in text and "(4, 8, -1): 1 (1)" in text and "(4, 8, 4): 1 (0)" in text
    assert "remaining mismatches (patched): none" in text
