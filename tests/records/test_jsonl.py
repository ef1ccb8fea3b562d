"""Loading a run directory: truncated last lines, corrupt lines, key dedupe, role split."""

from __future__ import annotations

import json

from records.jsonl import load_run
from records.rundir import load_config
from tests.reports.factory import candidate, pair, prompt, reference, write_run


def test_truncated_last_line_is_ignored(tmp_path):
    recs = pair(prompt(10), [1, 2, 3]) + pair(prompt(11), [4, 5], session_id="s1")
    write_run(tmp_path, recs)
    path = tmp_path / "records" / "candidate-i256.jsonl"
    with open(path, "a") as f:
        f.write(json.dumps(candidate(prompt(12), [6], session_id="s2"))[:57])  # killed mid-write
    run = load_run(tmp_path)
    assert [c["session_id"] for c in run.candidates] == ["s0", "s1"]
    assert len(run.references) == 2
    assert run.truncated == ["candidate-i256.jsonl:3"]
    assert run.corrupt == []


def test_unparseable_middle_line_is_skipped_and_reported(tmp_path):
    (tmp_path / "records").mkdir()
    good = [candidate(prompt(10), [1], session_id=f"s{i}") for i in range(2)]
    text = json.dumps(good[0]) + "\n" + '{"key": "broken' + "\n" + json.dumps(good[1]) + "\n"
    (tmp_path / "records" / "candidate-i256.jsonl").write_text(text)
    run = load_run(tmp_path)
    assert [c["session_id"] for c in run.candidates] == ["s0", "s1"]
    assert (run.corrupt, run.truncated) == (["candidate-i256.jsonl:2"], [])


def test_dedupe_by_key_keeps_the_first(tmp_path):
    p = prompt(10)
    first = candidate(p, [1, 2], key="i256-c1/s0/0")
    again = candidate(p, [9, 9], key="i256-c1/s0/0")
    ref_a, ref_b = reference(p, [1, 2]), reference(p, [7, 7])
    write_run(tmp_path, [first, again, ref_a, ref_b])
    run = load_run(tmp_path)
    assert len(run.candidates) == 1 and run.candidates[0]["output_ids"] == [1, 2]
    assert run.references[ref_a["input_hash"]]["output_ids"] == [1, 2]
    assert run.duplicates == 2


def test_roles_split_and_files_read_in_name_order(tmp_path):
    write_run(tmp_path, pair(prompt(10), [1], pool="i256") + pair(prompt(20), [2], pool="i128", interval=128))
    run = load_run(tmp_path)
    assert [c["pool"] for c in run.candidates] == ["i128", "i256"]
    assert all(r["role"] == "reference" for r in run.references.values())
    assert not run.empty


def test_missing_directory_and_config(tmp_path):
    run = load_run(tmp_path / "nope")
    assert run.empty and run.candidates == [] and run.references == {}
    assert load_config(tmp_path) == {}
    (tmp_path / "config.json").write_text('{"run_id": "r1", "gate": {"max_hard": 3}}')
    assert load_config(tmp_path)["gate"] == {"max_hard": 3}
