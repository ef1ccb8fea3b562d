"""A run directory converted to parquet parts renders the same report as its JSONL original."""

from __future__ import annotations

import shutil

import pytest

from records.compact import compact_run
from reports.render import render_run
from tests.reports.factory import synthetic_run

OUTPUTS = ["requests.csv", "boundaries.csv", "configs.csv", "coverage.csv", "summary.md", "junit.xml"]


@pytest.mark.parametrize("fault", [False, True])
def test_the_converted_run_renders_byte_identical_tables_and_the_same_verdict(tmp_path, fault):
    jsonl = synthetic_run(tmp_path / "jsonl", fault=fault, soft_sessions=1)
    parquet = tmp_path / "parquet"
    shutil.copytree(jsonl, parquet)
    assert [p.name for p in compact_run(parquet)] == ["part-000001"]
    assert not list((parquet / "records").glob("*.jsonl"))
    a, b = render_run(jsonl), render_run(parquet)
    assert a == b and a.headline == b.headline
    assert a.soft > 0 and (a.hard > 0) == fault  # the soft flips and the fault's hard mismatches survive
    for name in OUTPUTS:
        assert (parquet / name).read_bytes() == (jsonl / name).read_bytes(), name


def test_a_render_builds_whole_records_only_for_the_worst_cases(tmp_path, monkeypatch):
    """Issue 29: the render streams. Rows become record dicts only where the report shows them whole (its worst
    cases and their references); nothing loads the run's records."""
    import pandas as pd

    import records.jsonl
    import records.reader
    from reports.html_cases import worst_cases

    run_dir = synthetic_run(tmp_path / "run", fault=True, soft_sessions=1)
    compact_run(run_dir)
    want = render_run(run_dir)
    built: list[str] = []
    real = records.reader.from_batch

    def counting(batch, prompt):
        out = real(batch, prompt)
        built.extend(r.get("role") for r in out)
        return out

    def no_load(*_a, **_k):
        raise AssertionError("load_run called by a render")

    monkeypatch.setattr(records.reader, "from_batch", counting)
    monkeypatch.setattr(records.jsonl, "load_run", no_load)
    assert render_run(run_dir) == want
    cases = worst_cases(pd.read_csv(run_dir / "requests.csv"))
    assert 0 < len(cases) < 0.5 * len(pd.read_csv(run_dir / "requests.csv"))
    assert built.count("candidate") == len(cases)
    assert built.count("reference") == cases["input_hash"].nunique()
