"""Records read back from parquet parts equal what was written: typed columns, verbatim extras, float32 log-probs."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from records.columns import (
    FIELDS,
    REQUEST_SCHEMA,
    from_batch,
    null_columns,
    overrides,
    row_as_record,
    rows_as_records,
    stored_columns,
    to_batch,
)
from records.compact import compact_run
from records.jsonl import RecordFiles, load_run
from records.reader import RunReader
from tests.reports.factory import candidate, pair, prompt, reference, synthetic_run


def f32(x: float) -> float:
    return float(np.float32(x))


def roundtrip(tmp_path, records: list[dict], name: str = "candidate-i128.jsonl") -> list[dict]:
    files = RecordFiles(tmp_path, set())
    for rec in records:
        files.write(name, rec)
    files.close()
    assert not (tmp_path / "records" / name).exists()  # compacted
    run = load_run(tmp_path)
    return run.candidates + list(run.references.values()) + run.stats


def test_a_real_record_reads_back_equal_in_schema_order(tmp_path):
    cand = candidate(prompt(40), [1, 2, 3], spec_trace=[[41, 2, -1], [43, 1, None]], cache_lost="resume")
    (got,) = roundtrip(tmp_path, [cand])
    assert got == cand and list(got) == [f for f in FIELDS if f in cand]
    assert type(got["spec_accept_length"]) is float and type(got["turn"]) is int


# JSON values of every shape a server or a hand-edited file could put in a record
json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70), st.text(max_size=5),
                        st.floats(allow_nan=False, width=32))
json_value = st.recursive(json_scalar, lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=8)
f32_floats = st.floats(allow_nan=False, width=32)
ids = st.lists(st.integers(-(1 << 31), (1 << 31) - 1), max_size=6)
topk = st.lists(st.lists(st.tuples(f32_floats, st.integers(-(1 << 31), (1 << 31) - 1)).map(list), max_size=3),
                max_size=4)
FIELD_VALUES = {"int": st.integers(-(1 << 63), (1 << 63) - 1), "str": st.text(max_size=6), "json": json_value,
                "float": st.floats(allow_nan=False), "ids": ids, "logprobs": st.lists(f32_floats, max_size=5),
                "topk": topk, "trace": st.lists(st.lists(st.one_of(st.none(), st.integers(-9, 9)), max_size=3),
                                                max_size=3)}


@st.composite
def records(draw):
    """A record whose every field is absent, None, of its column's type, or any other JSON value."""
    rec = {}
    for name, kind in FIELDS.items():
        choice = draw(st.sampled_from(["typed", "typed", "none", "absent", "other"]))
        if choice == "typed":
            rec[name] = draw(FIELD_VALUES[kind])
        elif choice == "none":
            rec[name] = None
        elif choice == "other":
            rec[name] = draw(json_value)
    rec.update(draw(st.dictionaries(st.text(min_size=1, max_size=4).filter(lambda k: k not in FIELDS), json_value,
                                    max_size=2)))
    rec["key"] = draw(st.uuids()).hex
    return json.loads(json.dumps(rec))  # what a journal line reads back as


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(records(), min_size=1, max_size=8), st.sampled_from(["candidate-i128.jsonl", "stats.jsonl"]))
def test_any_record_reads_back_with_the_same_contents(tmp_path_factory, recs, name):
    """Typed values, values of another type, absent fields, unknown fields, any role: the same dict back."""
    tmp = tmp_path_factory.mktemp("r")
    for r in recs:
        r["role"] = "candidate"  # load_run splits by role; the columns do not care
    files = RecordFiles(tmp, set())
    for rec in recs:
        files.write(name, rec)
    files.close()
    reader = RunReader(tmp)
    assert [r for s in reader.stems() for r in reader.records(s)] == recs


@settings(max_examples=30, deadline=None)
@given(st.lists(records(), min_size=1, max_size=8))
def test_the_public_readers_give_each_field_as_the_record_has_it(recs):
    """What another package reads of stored rows (rows_as_records, row_as_record) is what the record reads back
    as, field by field: kept-verbatim values put back, absent fields left out."""
    batch = to_batch(recs, lambda r: True)
    back = from_batch(batch, prompt=None)  # every input_ids inline: no stored prompt is asked for
    over = overrides(batch)
    scalars = [f for f, kind in FIELDS.items() if kind != "topk"]
    assert rows_as_records(batch, scalars, over) == [{f: r[f] for f in scalars if f in r} for r in back]
    assert rows_as_records(batch, ["key", "turn"]) == [{f: r[f] for f in ("key", "turn") if f in r} for r in back]
    for i, r in enumerate(back):
        assert row_as_record(batch, i, list(FIELDS), over[i]) == {f: r[f] for f in FIELDS if f in r}
        assert over[i].absent == {f for f in FIELDS if f not in recs[i]}


def test_stored_columns_name_what_holds_some_fields():
    cols = stored_columns(["error", "output_ids", "output_top_logprobs"])
    assert cols[:2] == ["error", "output_ids"] and set(cols) <= set(REQUEST_SCHEMA.names)
    assert len(cols) == 6  # the top-k's two columns, and the two that say where a row departs from its columns
    nulls = null_columns(cols, 3)
    assert nulls.num_rows == 3 and nulls.schema == pa.schema([REQUEST_SCHEMA.field(c) for c in cols])
    assert all(nulls.column(c).null_count == 3 for c in cols)


def test_log_probs_are_stored_as_float32_and_nothing_else_loses_precision(tmp_path):
    cand = candidate(prompt(8), [5, 6], ttft=0.1, itl=1 / 3, e2e=1e-300, t_start=1796138172.1308448)
    cand["output_logprobs"] = [-0.1, -1 / 3]
    cand["output_top_logprobs"] = [[[-0.1, 5], [-2.3, 9]], [[-1 / 3, 6], [-0.7, 1]]]
    cand["spec_accept_length"] = 2 / 3
    (got,) = roundtrip(tmp_path, [cand])
    assert got["output_logprobs"] == [f32(-0.1), f32(-1 / 3)] != cand["output_logprobs"]
    assert got["output_top_logprobs"] == [[[f32(-0.1), 5], [f32(-2.3), 9]], [[f32(-1 / 3), 6], [f32(-0.7), 1]]]
    rest = {k: v for k, v in got.items() if k not in ("output_logprobs", "output_top_logprobs")}
    assert rest == {k: v for k, v in cand.items() if k not in ("output_logprobs", "output_top_logprobs")}


def test_values_that_do_not_fit_their_column_are_kept_verbatim(tmp_path):
    cand = candidate(prompt(8), [5, 6])
    cand.update(turn=True, interval="128", output_ids=[1, 2.0], output_logprobs=[0, -1.5],  # bool, str, float, int
                output_top_logprobs=[[[-0.5, 5, None]], [[-1.5, 6]]], spec_trace=[[1, 2, 3.5]],
                cached_tokens=1 << 64, input_ids=[1, 1 << 40], new_field={"a": [1]})
    del cand["tokenizer"]
    (got,) = roundtrip(tmp_path, [cand])
    assert got == cand and "tokenizer" not in got
    assert type(got["turn"]) is bool and type(got["output_ids"][1]) is float and type(got["output_logprobs"][0]) is int


def test_prompts_are_stored_once_per_distinct_input(tmp_path):
    recs = []
    for s in range(3):
        recs += pair(prompt(50, seed=s), [1, 2], session_id=f"s{s}", concurrency=1)
        recs.append(candidate(prompt(50, seed=s), [1, 2], session_id=f"s{s}", concurrency=4))  # same input again
    files = RecordFiles(tmp_path, set())
    for r in recs:
        files.write("reference.jsonl" if r["role"] == "reference" else "candidate-i256.jsonl", r)
    files.compact()
    files.write("candidate-i256.jsonl", candidate(prompt(50, seed=0), [1, 2], session_id="s0", concurrency=8))
    files.close()  # a second part: its record's prompt is in the first
    parts = sorted((tmp_path / "records").iterdir())
    assert [p.name for p in parts] == ["part-000001", "part-000002"]
    prompts = pq.read_table(parts[0] / "prompts.parquet")
    assert sorted(prompts.column("input_hash").to_pylist()) == sorted({r["input_hash"] for r in recs})
    assert not (parts[1] / "prompts.parquet").exists()
    for part in parts:
        for f in part.glob("[cr]*.parquet"):
            assert pq.read_table(f, columns=["input_ids"]).column(0).null_count == pq.read_metadata(f).num_rows
    run = load_run(tmp_path)
    assert [c["input_ids"] for c in run.candidates] == [r["input_ids"] for r in recs if r["role"] == "candidate"] \
        + [prompt(50, seed=0)]
    run.candidates[0]["input_ids"].append(7)  # each record has its own list
    assert run.candidates[1]["input_ids"] == prompt(50, seed=0)


def test_a_hash_shared_by_two_inputs_keeps_both_exact(tmp_path):
    a, b = candidate(prompt(20), [1], session_id="a"), candidate(prompt(20, seed=3), [1], session_id="b")
    b["input_hash"] = a["input_hash"]  # a collision (or a hand-edited record)
    assert roundtrip(tmp_path, [a, b]) == [a, b]


def test_old_jsonl_runs_read_the_same_before_and_after_conversion(tmp_path):
    synthetic_run(tmp_path, fault=True, soft_sessions=1)
    before = load_run(tmp_path)
    assert [p.name for p in compact_run(tmp_path)] == ["part-000001"]
    assert sorted(p.name for p in (tmp_path / "records").iterdir()) == ["part-000001"]
    after = load_run(tmp_path)
    assert (after.candidates, after.references, after.stats) == (before.candidates, before.references, before.stats)
    assert compact_run(tmp_path) == []  # nothing left to compact


def test_corrupt_journal_lines_are_still_reported_after_compaction(tmp_path):
    (tmp_path / "records").mkdir()
    good = [candidate(prompt(10), [1], session_id=f"s{i}") for i in range(2)]
    text = json.dumps(good[0]) + "\n" + '{"key": "broken' + "\n" + json.dumps(good[1]) + "\n"
    (tmp_path / "records" / "candidate-i256.jsonl").write_text(text)
    compact_run(tmp_path)
    run = load_run(tmp_path)
    assert run.candidates == good and run.corrupt == ["candidate-i256.jsonl:2"]


def test_the_schema_has_a_column_for_every_field():
    assert set(REQUEST_SCHEMA.names) == (set(FIELDS) - {"output_top_logprobs"}) | {
        "top_logprobs", "top_ids", "_extra", "_absent"}
    assert str(REQUEST_SCHEMA.field("output_logprobs").type) == "list<item: float>"
    assert str(REQUEST_SCHEMA.field("output_ids").type) == "list<item: int32>"


def test_references_keep_their_input_hash_join(tmp_path):
    recs = pair(prompt(30), [4, 5]) + [reference(prompt(31), [7])]
    files = RecordFiles(tmp_path, set())
    for r in recs:
        files.write("reference.jsonl" if r["role"] == "reference" else "candidate-i256.jsonl", r)
    files.close()
    run = load_run(tmp_path)
    assert run.references == {r["input_hash"]: r for r in recs if r["role"] == "reference"}
