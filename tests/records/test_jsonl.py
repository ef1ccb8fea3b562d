"""Loading a run directory: truncated last lines, corrupt lines, key dedupe, role split, resume after a kill."""

from __future__ import annotations

import json

import pytest

from records.jsonl import RecordFiles, load_run, read_jsonl, truncate_partial_line
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


def line(key: str) -> bytes:
    return json.dumps({"key": key, "role": "candidate"}).encode()


READ_CASES = [
    # (case, file bytes, keys read, truncated line numbers, corrupt line numbers)
    ("complete", line("a") + b"\n" + line("b") + b"\n", ["a", "b"], [], []),
    ("empty-file", b"", [], [], []),
    ("unterminated-valid-json", line("a") + b"\n" + line("b"), ["a"], [2], []),  # the writer would cut it
    ("only-an-unterminated-line", line("a"), [], [1], []),
    ("unterminated-garbage", line("a") + b'\n{"key": "b', ["a"], [2], []),
    ("unterminated-invalid-utf8", line("a") + b'\n{"key": "\xff', ["a"], [2], []),
    ("whitespace-tail", line("a") + b"\n  ", ["a"], [], []),
    ("corrupt-middle", line("a") + b'\n{"key": "b\n' + line("c") + b"\n", ["a", "c"], [], [2]),
    ("corrupt-and-truncated", line("a") + b"\n}{\n" + line("c") + b"\n" + line("d")[:9], ["a", "c"], [4], [2]),
    ("blank-lines", b"\n" + line("a") + b"\n\n   \n" + line("b") + b"\n\n", ["a", "b"], [], []),
    ("non-object-json", line("a") + b'\n[1, 2]\n"text"\n5\nnull\ntrue\n' + line("b") + b"\n", ["a", "b"], [],
     [2, 3, 4, 5, 6]),
    ("invalid-utf8-line", line("a") + b'\n\xff\xfe{"key": "x"}\n' + line("b") + b"\n", ["a", "b"], [], [2]),
    ("crlf", line("a") + b"\r\n" + line("b") + b"\r\n", ["a", "b"], [], []),
]


@pytest.mark.parametrize("data,keys,truncated,corrupt", [c[1:] for c in READ_CASES], ids=[c[0] for c in READ_CASES])
def test_read_jsonl_truncated_and_corrupt_lines(tmp_path, data, keys, truncated, corrupt):
    path = tmp_path / "candidate-i256.jsonl"
    path.write_bytes(data)
    records, trunc, bad = read_jsonl(path)
    assert [r["key"] for r in records] == keys
    assert trunc == [f"candidate-i256.jsonl:{n}" for n in truncated]
    assert bad == [f"candidate-i256.jsonl:{n}" for n in corrupt]
    # the writer's cut agrees with the reader: it drops exactly the unterminated tail, and no record
    assert truncate_partial_line(path) == len(data) - (data.rfind(b"\n") + 1)
    after, trunc_after, bad_after = read_jsonl(path)
    assert (after, trunc_after, bad_after) == (records, [], bad)


def rec(i: int) -> dict:
    return candidate(prompt(10, seed=i), [i, i + 1], session_id=f"s{i}")


@pytest.mark.parametrize("compacted_first", [False, True])
def test_resume_after_a_kill_mid_line_keeps_every_record_once_in_order(tmp_path, compacted_first):
    """Killed with records in the journals (and, `compacted_first`, an earlier part beside them)."""
    files = RecordFiles(tmp_path, set())
    files.write("candidate-i256.jsonl", rec(0))
    if compacted_first:
        files.compact()
    for i in (1, 2):
        files.write("candidate-i256.jsonl", rec(i))
    files.write("reference.jsonl", reference(prompt(10, seed=0), [0, 1]))
    del files  # killed: no close, no compaction; every line written so far was flushed
    cand = tmp_path / "records" / "candidate-i256.jsonl"
    ref = tmp_path / "records" / "reference.jsonl"
    lines = 2 if compacted_first else 3
    with open(cand, "a") as f:  # killed while writing record 3: a complete JSON object, no newline yet
        f.write(json.dumps(rec(3), separators=(",", ":")))
    with open(ref, "a") as f:  # and in the middle of a reference line
        f.write(json.dumps(reference(prompt(10, seed=1), [5]))[:40])
    before = load_run(tmp_path)
    assert [c["session_id"] for c in before.candidates] == ["s0", "s1", "s2"]
    assert before.truncated == [f"candidate-i256.jsonl:{lines + 1}", "reference.jsonl:2"] and before.corrupt == []

    existing = set(before.candidates_by_key()) | {r["key"] for r in before.references.values()}
    files = RecordFiles(tmp_path, existing)  # cuts both partial lines, then compacts what the journals hold
    assert not cand.exists() and not ref.exists()
    assert load_run(tmp_path).truncated == [] and load_run(tmp_path).candidates == before.candidates
    with pytest.raises(AssertionError, match="written twice"):
        files.write("candidate-i256.jsonl", rec(1))
    for i in (3, 4):
        files.write("candidate-i256.jsonl", rec(i))
    files.close()

    after = load_run(tmp_path)
    assert [c["session_id"] for c in after.candidates] == ["s0", "s1", "s2", "s3", "s4"]
    assert [c["output_ids"] for c in after.candidates] == [[i, i + 1] for i in range(5)]
    assert after.candidates == [rec(i) for i in range(5)]
    assert (after.truncated, after.corrupt, after.duplicates) == ([], [], 0)
    assert list(after.references) == [reference(prompt(10, seed=0), [0, 1])["input_hash"]]
    assert sorted(p.name for p in (tmp_path / "records").iterdir()) == [
        f"part-{n:06d}" for n in range(1, 4 if compacted_first else 3)]


def test_a_journal_line_reads_back_as_the_record_whatever_orjson_would_make_of_it():
    """encode: orjson where its line reads back as the record; the standard library for what orjson would write
    otherwise (a non-finite float as null) or refuses (an int beyond 64 bits, a lone surrogate, a non-str key)."""
    import json
    import math

    from records.journal import encode

    plain = {"key": "a", "output_logprobs": [-0.1, -1 / 3], "output_text": "é\u2028", "error": None}
    assert encode(plain) == json.dumps(plain, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
    odd = [{"key": "b", "ttft": math.inf, "itl": -math.inf}, {"key": "c", "big": -(2**63) - 1},
           {"key": "d", "text": "\udc80"}, {"key": "e", "turns": (1, 2)}, {"key": "f", "m": {1: 2}}]
    for rec in odd:
        line = encode(rec)
        assert line == (json.dumps(rec, separators=(",", ":")) + "\n").encode() and line.endswith(b"}\n")
    back = json.loads(encode({"key": "g", "lp": [math.nan]}))
    assert math.isnan(back["lp"][0])
