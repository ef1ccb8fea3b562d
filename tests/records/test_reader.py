"""The bounded-memory reader: Arrow batches per pool, ids of just the rows asked for."""

from __future__ import annotations

import pyarrow as pa
import pytest

from records.columns import REQUEST_SCHEMA
from records.jsonl import RecordFiles, load_run
from records.reader import RunReader
from tests.reports.factory import candidate, prompt, reference


def session(pool: str, concurrency: int, sid: str, turns: int, seed: int, fail_at: int | None = None) -> list[dict]:
    """Candidates of one session (turn n built on turn n-1's output) and their references."""
    out, ids = [], prompt(40, seed=seed)
    for n in range(turns):
        output = [seed + n, seed + n + 1, seed + n + 2]
        err = "boom" if n == fail_at else None
        cand = candidate(ids, output, pool=pool, concurrency=concurrency, session_id=sid, turn=n, error=err)
        out += [cand, reference(ids, output)]
        ids = ids + output + [10, 10]
    return out


def write(run_dir, recs: list[dict], compact_after: int | None = None) -> None:
    """Write through RecordFiles; compact once after `compact_after` records, and leave the rest in journals
    (as a killed run does) unless compact_after is None (then close: everything in parts)."""
    files = RecordFiles(run_dir, set())
    for i, r in enumerate(recs):
        name = "reference.jsonl" if r["role"] == "reference" else f"candidate-{r['pool']}.jsonl"
        if r["role"] == "reference" and r["key"] in files.keys:
            continue
        files.write(name, r)
        if compact_after is not None and i + 1 == compact_after:
            files.compact()
    if compact_after is None:
        files.close()


RECS = (session("i128", 1, "a", 3, 1) + session("i128", 4, "a", 2, 1) + session("i256", 1, "b", 3, 7, fail_at=1)
        + session("i128", 1, "c", 1, 20))


@pytest.fixture(params=["parts", "parts-and-journals", "journals"])
def run_dir(request, tmp_path):
    write(tmp_path, RECS, {"parts": None, "parts-and-journals": 9, "journals": 0}[request.param])
    return tmp_path


def test_batches_are_the_typed_columns_of_each_pool_in_write_order(run_dir):
    reader = RunReader(run_dir)
    assert reader.stems() == ["candidate-i128", "candidate-i256", "reference"]
    batches = list(reader.batches("candidate-i128", ["key", "turn", "output_ids", "output_logprobs"]))
    assert all(b.schema == pa.schema([REQUEST_SCHEMA.field(c) for c in ("key", "turn", "output_ids",
                                                                          "output_logprobs")]) for b in batches)
    table = pa.Table.from_batches(batches)
    want = [r for r in RECS if r["role"] == "candidate" and r["pool"] == "i128"]
    assert table.column("key").to_pylist() == [r["key"] for r in want]
    assert table.column("output_ids").to_pylist() == [r["output_ids"] for r in want]
    every = pa.Table.from_batches(list(reader.batches("candidate-i256")))
    assert every.schema == REQUEST_SCHEMA and every.num_rows == 3


def test_batches_drop_duplicate_keys_with_one_seen_set(tmp_path):
    first = candidate(prompt(10), [1], key="i128-c1/s/0", pool="i128")
    again = candidate(prompt(10), [9], key="i128-c1/s/0", pool="i128")
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "candidate-i128.jsonl").write_text(
        "".join(__import__("json").dumps(r) + "\n" for r in (first, again)))
    reader, seen = RunReader(tmp_path), set()
    (batch,) = reader.batches("candidate-i128", ["output_ids"], seen)
    assert batch.column("output_ids").to_pylist() == [[1]] and batch.schema.names == ["output_ids"]
    assert seen == {"i128-c1/s/0"} and reader.duplicates == 1


def test_turn_io_gives_the_ids_a_next_turn_is_built_from(run_dir):
    reader = RunReader(run_dir)
    want = {"i128-c1/a/2", "i256-c1/b/0", "i128-c1/c/0"}
    got = reader.turn_io(want | {"i999-c1/nope/0"})
    by_key = {r["key"]: r for r in load_run(run_dir).candidates}
    assert got == {k: (by_key[k]["input_ids"], by_key[k]["output_ids"]) for k in want}


def test_prompts_of_just_some_hashes(run_dir):
    reader = RunReader(run_dir)
    refs = load_run(run_dir).references
    some = sorted(refs)[:3]
    got = reader.prompts(some + ["0" * 16])
    in_parts = {h for h in some if h in got}
    assert all(got[h] == refs[h]["input_ids"] for h in in_parts)
    if (run_dir / "records" / "reference.jsonl").exists() and not list((run_dir / "records").glob("part-*")):
        assert got == {}  # journals keep their ids inline: no stored prompts
    else:
        assert in_parts  # at least the first part's prompts are stored


def test_a_damaged_directory_says_what_is_missing(tmp_path):
    write(tmp_path, session("i128", 1, "a", 1, 1))
    for p in (tmp_path / "records").glob("part-*/prompts.parquet"):
        p.unlink()
    with pytest.raises(ValueError, match="no prompts.parquet holds it"):
        load_run(tmp_path)


def test_find_gives_load_runs_records_by_key_and_references_by_hash(tmp_path):
    import shutil as _shutil

    from records.compact import compact_run as _compact
    from records.jsonl import load_run as _load
    from records.reader import RunReader as _Reader
    from tests.reports.factory import synthetic_run

    jsonl = synthetic_run(tmp_path / "jsonl", fault=True, soft_sessions=1)
    parts = tmp_path / "parts"
    _shutil.copytree(jsonl, parts)
    _compact(parts)
    for d in (jsonl, parts):
        run = _load(d)
        keys = [c["key"] for c in run.candidates[::5]]
        hashes = [c["input_hash"] for c in run.candidates[::7]]
        reader = _Reader(d)
        assert reader.find("key", keys + ["nope"], "candidate") == {c["key"]: c for c in run.candidates[::5]}
        assert reader.find("input_hash", hashes, "reference") == {h: run.references[h] for h in hashes}
