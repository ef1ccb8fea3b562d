"""The streamed analyzer (reports/analyze_run.py) gives the frame of the record analyzer (reports/analyze.py)
over load_run's records: on JSONL runs, on compacted parts, on a mix, with odd records, under a tiny cache."""

from __future__ import annotations

import json
import random
import shutil

import pandas as pd
import pytest

from records.compact import compact_run
from records.jsonl import load_run
from reports.analyze import analyze
from reports.analyze_run import analyze_run
from reports.facts import TokenFacts
from reports.latency import request_latency
from reports.tree_shapes import request_shapes
from tests.reports.factory import candidate, pair, prompt, reference, synthetic_run, write_run


def same(run_dir, **kw):
    """Assert the two analyzers agree on `run_dir`; return the streamed result."""
    run = load_run(run_dir)
    per_pool = kw.get("per_pool")
    want = analyze(run.candidates, run.references, kw.get("threshold", 0.5), kw.get("tolerance", 1e-3), per_pool)
    got = analyze_run(run_dir, kw.get("threshold", 0.5), kw.get("tolerance", 1e-3), per_pool,
                      budget=kw.get("budget", 256 << 20), ladder_pools=lambda pool: pool != "i256")
    pd.testing.assert_frame_equal(got.df, want)
    assert (got.truncated, got.corrupt, got.duplicates) == (run.truncated, run.corrupt, run.duplicates)
    assert got.stats == run.stats
    assert list(got.df["key"]) == [c["key"] for c in run.candidates]
    assert got.run_id == run.candidates[0].get("run_id")
    pd.testing.assert_frame_equal(got.latency, request_latency(run.candidates))
    want_facts = TokenFacts.of({c["key"]: c for c in run.candidates}, run.references,
                               lambda pool: pool != "i256").by_key()
    got_facts = got.facts.by_key()
    # journals hold log-probs as JSON floats, the streamed path reads them as stored columns (float32)
    assert got_facts["first_drift"] == pytest.approx(want_facts["first_drift"], rel=1e-5, abs=1e-7)
    assert got_facts["accepted"] == want_facts["accepted"]
    # the calibration's ladder sums, of the pools asked for only
    assert set(got_facts["ladders"]) == set(want_facts["ladders"])
    assert all(c["pool"] != "i256" for c in run.candidates if c["key"] in got_facts["ladders"])
    for key, sums in want_facts["ladders"].items():
        assert got_facts["ladders"][key] == pytest.approx(sums, rel=1e-5, abs=1e-6), key
    pd.testing.assert_frame_equal(got.shapes, request_shapes(run.candidates))
    return got


@pytest.mark.parametrize("fault", [False, True])
@pytest.mark.parametrize("compacted", [False, True])
def test_synthetic_runs_analyze_the_same_streamed(tmp_path, fault, compacted):
    run_dir = synthetic_run(tmp_path / "run", fault=fault, soft_sessions=1)
    if compacted:
        compact_run(run_dir)
    got = same(run_dir)
    classes = set(got.df["class"])
    assert ("hard" in classes) == fault and "soft" in classes
    assert got.df["restored_link"].notna().any() and got.df["n_crossings"].sum() > 0
    restored = set(got.df.loc[got.df["restored"], "key"])
    first_same = set(got.df.loc[got.df["divergence_pos"].isna() | (got.df["first_divergence"] > 0), "key"])
    facts = got.facts.by_key()
    assert restored and restored & first_same <= set(facts["first_drift"])  # same first token: compared
    assert sum(n or 0 for n in facts["accepted"].values()) > 0
    assert got.shapes["shape"].notna().sum() == len(restored)


def test_a_one_byte_cache_and_per_pool_thresholds_change_nothing(tmp_path):
    run_dir = synthetic_run(tmp_path / "run", fault=True, soft_sessions=2)
    compact_run(run_dir)
    same(run_dir, budget=1, per_pool={"i128": (0.1, 1e-6)})


def test_parts_and_journals_mixed_with_duplicates_a_truncated_line_and_missing_references(tmp_path):
    run_dir = synthetic_run(tmp_path / "run", fault=True, soft_sessions=1)
    compact_run(run_dir)
    recs = []
    for s in range(3):  # a second batch, left in journals: one without a reference, one duplicate key
        p0 = prompt(130, seed=40 + s)
        recs += pair(p0, [100 + j for j in range(9)], pool="i128", interval=128, concurrency=8,
                     session_id=f"late-{s}", spec_trace=None)
    recs = [r for r in recs if r["key"] != recs[3]["key"]]  # late-1's reference
    recs.append(dict(recs[0]))  # a key recorded twice: the second is dropped
    write_run(run_dir, recs)
    with open(run_dir / "records" / "candidate-i128.jsonl", "a") as f:
        f.write('{"key": "half')  # a killed writer's partial line
    got = same(run_dir)
    assert got.duplicates == 1 and got.truncated
    assert (got.df["detail"] == "no reference").sum() == 1


def test_odd_records_take_the_record_oracle_and_still_agree(tmp_path):
    rng = random.Random(7)
    recs = []
    for s in range(12):
        p0 = prompt(120 + s, seed=s)
        out = [100 + (j * s) % 30 for j in range(14)]
        c, r = pair(p0, out, pool="i128", interval=128, session_id=f"odd-{s}",
                    spec_trace=[[len(p0) + 1, 4, -1], [len(p0) + 5, 4, 2]])
        if s % 4 == 0:
            c["output_logprobs"] = c["output_logprobs"][:-2]  # shorter than its output
        if s % 4 == 1:
            c["output_ids"] = c["output_ids"] + [1 << 40]  # an id past int32: kept in _extra
        if s % 4 == 2:
            c["spec_trace"] = [[len(p0) + 1, 4]]  # steps without a tracked value
            r["error"] = "reference failed"
        if s % 4 == 3:
            c.pop("completion_tokens")  # absent: the frame counts the output instead
            c["input_len"] = 0  # and takes the input's length
        c["output_logprobs"] = [x + rng.choice([0.0, 1e-2]) for x in c["output_logprobs"]]
        recs += [c, r]
    write_run(tmp_path / "run", recs)
    same(tmp_path / "run")
    parts = tmp_path / "parts"
    shutil.copytree(tmp_path / "run", parts)
    compact_run(parts)
    same(parts)


def test_later_turns_linked_through_stored_prompts_and_a_branch_off_the_history(tmp_path):
    recs = []
    p0 = prompt(250, seed=3)
    out0 = [100 + j % 9 for j in range(20)]
    trace0 = [[251, 4, 4], [255, 4, 0], [259, 4, -1]]
    recs += pair(p0, out0, pool="i256", interval=256, session_id="s", spec_trace=trace0)
    p1 = p0 + out0 + prompt(30, seed=5)
    recs += pair(p1, out0[:5], pool="i256", interval=256, session_id="s", turn=1, cached_tokens=256,
                 spec_trace=[])
    p2 = p0 + [7] * 30  # branches off below 256: it restored another path's checkpoint
    recs += pair(p2, out0[:3], pool="i256", interval=256, session_id="s", turn=2, cached_tokens=256)
    recs.append(candidate(p1 + [1] * 300, [5], pool="i256", session_id="s", turn=3, cached_tokens=256))
    recs.append(reference(p1 + [1] * 300, [5]))
    write_run(tmp_path / "run", recs)
    compact_run(tmp_path / "run")
    got = same(tmp_path / "run")
    assert list(got.df["restored_link"].fillna("-")) == ["-", "verify", "none", "none"]  # 3 left 2's path
    assert json.loads(got.df["crossings"].iloc[0])[0]["boundary"] == 256  # JSON text, as in requests.csv


def test_junit_from_the_frame_without_dicts_writes_what_the_dict_grouping_wrote(tmp_path, monkeypatch):
    import xml.etree.ElementTree as ET

    from reports import junit

    run_dir = synthetic_run(tmp_path / "run", fault=True, soft_sessions=2)
    df = analyze_run(run_dir).df
    df.loc[3, "class"], df.loc[3, "e2e"] = "error", float("nan")
    got = ET.tostring(junit.junit_tree(df, "r").getroot())
    monkeypatch.setattr(junit, "_rows", lambda part: part.to_dict("records"))  # every row through to_dict
    assert got == ET.tostring(junit.junit_tree(df, "r").getroot())
    assert b"soft flip" in got and b"failure" in got and b"<error" in got


@pytest.mark.parametrize("at_once", [4096, 3, 2, 1])  # a testsuite's testcases in one piece or in several
def test_junit_written_a_testsuite_at_a_time_is_the_whole_tree_written(tmp_path, monkeypatch, at_once):
    from reports import junit
    from reports.gate import GateThresholds, evaluate

    monkeypatch.setattr(junit, "_CASES_AT_ONCE", at_once)
    run_dir = synthetic_run(tmp_path / "run", fault=True, soft_sessions=2)
    df = analyze_run(run_dir).df
    df.loc[3, "class"], df.loc[3, "e2e"] = "error", float("nan")
    verdict = evaluate(df, GateThresholds())
    cases = [(df, None), (df, verdict), (df.iloc[:0], verdict), (df.iloc[:0], None), (df.iloc[:4], None)]
    for i, (frame, v) in enumerate(cases):
        junit.junit_tree(frame, "r & <s>", v).write(tmp_path / f"tree{i}.xml", encoding="utf-8", xml_declaration=True)
        junit.write_junit(frame, tmp_path / f"streamed{i}.xml", "r & <s>", v)
        assert (tmp_path / f"streamed{i}.xml").read_bytes() == (tmp_path / f"tree{i}.xml").read_bytes(), i
    assert (tmp_path / "streamed1.xml").read_bytes().count(b"<testsuite ") > 2
