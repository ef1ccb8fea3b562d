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
