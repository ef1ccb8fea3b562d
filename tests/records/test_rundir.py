"""Run directories: latest link, truncated lines, duplicate refusal, record fields."""

from __future__ import annotations

import hashlib
import json

import pytest

from harness.backends.sglang import parse_answer
from records.jsonl import RecordFiles, load_run, read_jsonl, truncate_partial_line
from records.rundir import create_run_dir, input_hash
from records.schema import build_record, candidate_key
from tests.harness.helpers import SUFFIX, make_sessions

RECORD_FIELDS = {  # docs/records.md, in order
    "schema", "run_id", "key", "role", "pool", "engine", "interval", "concurrency", "replica_id", "node_id",
    "suite", "case_id", "session_id", "turn", "case", "input_hash", "input_len", "input_ids", "max_new_tokens",
    "output_ids", "output_text", "output_logprobs", "output_top_logprobs", "cached_tokens", "completion_tokens",
    "finish_reason", "spec_verify_ct", "spec_accept_length", "spec_trace", "ttft", "itl", "e2e", "t_start",
    "retries", "error", "tokenizer", "cache_lost", "t_planned", "request_rate", "arrival", "ttst",
    "injected_fault_hit",
}


def test_input_hash_is_the_documented_sha256_prefix():
    ids = [1, 2, 300]
    assert input_hash(ids) == hashlib.sha256(b"[1, 2, 300]").hexdigest()[:16] == input_hash(tuple(ids))


def test_create_run_dir_points_latest_and_refuses_reuse(tmp_path):
    a = create_run_dir(tmp_path, "a")
    b = create_run_dir(tmp_path, "b")
    assert (a / "records").is_dir() and (tmp_path / "latest").resolve() == b.resolve()
    with pytest.raises(FileExistsError, match="--resume"):
        create_run_dir(tmp_path, "a")


def test_truncated_last_line_is_cut_before_appending(tmp_path):
    run = tmp_path / "r"
    (run / "records").mkdir(parents=True)
    path = run / "records" / "candidate-i128.jsonl"
    path.write_text('{"key": "k1", "role": "candidate", "input_hash": "h"}\n{"key": "k2", "ro')
    records, truncated, corrupt = read_jsonl(path)
    assert [r["key"] for r in records] == ["k1"] and truncated == ["candidate-i128.jsonl:2"] and corrupt == []
    files = RecordFiles(run, {"k1"}, compact_on_open=False)
    files.write("candidate-i128.jsonl", {"key": "k3", "role": "candidate", "input_hash": "h"})
    assert [json.loads(x)["key"] for x in path.read_text().splitlines()] == ["k1", "k3"]
    assert truncate_partial_line(path) == 0
    files.close()  # compacted: the journal's records are now in a part
    assert not path.exists()
    recorded = load_run(run)
    assert set(recorded.candidates_by_key()) == {"k1", "k3"} and recorded.references == {}


def test_a_key_is_never_written_twice(tmp_path):
    files = RecordFiles(tmp_path, {"old"})
    files.write("reference.jsonl", {"key": "ref/x"})
    with pytest.raises(AssertionError, match="written twice"):
        files.write("reference.jsonl", {"key": "ref/x"})
    with pytest.raises(AssertionError, match="written twice"):
        files.write("reference.jsonl", {"key": "old"})
    files.close()


def test_record_has_every_documented_field():
    s = make_sessions(1)[0]
    ids = s.turn_input(0, None, None)
    answer = {"text": "ab", "output_ids": [97, 98], "meta_info": {
        "finish_reason": {"type": "length", "length": 2}, "cached_tokens": 0, "completion_tokens": 2,
        "output_token_logprobs": [[-0.1, 97, None], [-0.2, 98, None]],
        "output_top_logprobs": [[[-0.1, 97, None], [-2, 3, None]], [[-0.2, 98, None], [-3, 4, None]]],
        "spec_verify_ct": 1, "spec_trace": [[20, 2, -1]]}}
    gen = parse_answer(answer, 0.01, 0.002, 0.02)
    rec = build_record(run_id="r", key=candidate_key("i128", 4, s.session_id, 0), role="candidate", pool="i128",
                       engine={"interval": 128}, concurrency=4, replica_id="i128-r0", node_id="n", session=s,
                       turn=0, input_ids=ids, input_hash=input_hash(ids), max_new_tokens=2, gen=gen, t_start=1.0,
                       retries=0, error=None, tokenizer="byte")
    assert set(rec) == RECORD_FIELDS
    assert rec["key"] == "i128-c4/s0/0" and rec["finish_reason"] == "length" and rec["interval"] == 128
    assert rec["output_top_logprobs"][0] == [[-0.1, 97], [-2.0, 3]] and rec["spec_accept_length"] == 2.0
    assert rec["case"]["group"] == "test" and rec["case_id"] == "s0"
    assert rec["injected_fault_hit"] is None  # the server said nothing: not False
    for said, kept in ((True, True), (False, False), ("yes", None)):
        meta = dict(answer["meta_info"], injected_fault_hit=said)
        assert parse_answer(dict(answer, meta_info=meta), 0.01, 0.002, 0.02).injected_fault_hit is kept
    assert s.turn_input(1, ids, [97, 98]) == ids + [97, 98] + list(SUFFIX)
    with pytest.raises(ValueError, match="needs turn 0's output"):
        s.turn_input(1, ids, None)
