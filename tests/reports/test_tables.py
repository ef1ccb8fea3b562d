"""boundaries.csv, configs.csv and requests.csv from hand-built records."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from reports.analyze import analyze
from reports.tables import BOUNDARY_COLUMNS, CONFIG_COLUMNS, boundaries_table, configs_table, write_tables
from reports.tree_shapes import SHAPE_COLUMNS
from tests.reports.factory import candidate, pair, prompt, reference


@pytest.fixture(scope="module")
def df() -> pd.DataFrame:
    p0 = prompt(250)  # prompt offset -6
    out0 = list(range(65, 81))
    p1 = p0 + out0 + prompt(10, 5)  # 276 tokens: offset +20
    records = (
        pair(p0, out0, session_id="s", spec_trace=[[251, 3, -1], [254, 3, -1], [257, 3, -1]],
             t_start=1000.0, e2e=1.0, ttft=0.1, accept=2.0)
        + pair(p1, [71] * 8, [70] * 8, session_id="s", turn=1, cached_tokens=256, spec_trace=[[277, 4, -1]],
               t_start=1000.5, e2e=1.5, ttft=0.2, accept=4.0)
        + pair(prompt(300, 1), [80, 81, 1, 83, 84, 85, 86, 87], [80, 81, 82, 83, 84, 85, 86, 87], margins={2: 0.25},
               session_id="t", spec_trace=[[301, 7, -1]], t_start=1001.0, e2e=0.5, ttft=0.3, accept=3.0)
    )
    cands = [r for r in records if r["role"] == "candidate"]
    refs = {r["input_hash"]: r for r in records if r["role"] == "reference"}
    return analyze(cands, refs)


def test_classes_of_the_scenario(df):
    assert list(df["class"]) == ["exact", "hard", "soft"]


def test_boundaries_table_rows(df):
    b = boundaries_table(df)
    assert list(b.columns) == BOUNDARY_COLUMNS
    got = [(r["boundary_kind"], r["offset"], None if pd.isna(r["commit_len"]) else r["commit_len"], r["requests"],
            r["exact"], r["soft"], r["hard"], r["error"], r["untracked"]) for r in b.to_dict("records")]
    assert got == [
        ("restored", 20, None, 1, 0, 0, 1, 0, 0),
        ("restored_verify", 1, 3, 1, 0, 0, 1, 0, 1),
        ("crossed_verify", 1, 3, 1, 1, 0, 0, 0, 1),
        ("prompt", -6, None, 1, 1, 0, 0, 0, 0),
        ("prompt", 20, None, 1, 0, 0, 1, 0, 0),
        ("prompt", 44, None, 1, 0, 1, 0, 0, 0),
        ("divergence", 20, None, 1, 0, 0, 1, 0, 0),
        ("divergence", 46, None, 1, 0, 1, 0, 0, 0),
    ]
    assert set(b["interval"]) == {256}
    assert list(b["hard_rate"]) == [1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0]


def test_inferred_crossings_have_their_own_kind():
    records = pair(prompt(250), list(range(65, 75)), pool="i128", interval=128)  # crosses 256, no spec_trace
    cands = [r for r in records if r["role"] == "candidate"]
    b = boundaries_table(analyze(cands, {records[1]["input_hash"]: records[1]}))
    row = b[b["boundary_kind"] == "crossed_inferred"].iloc[0]
    assert (row["interval"], row["requests"], row["exact"]) == (128, 1, 1)
    assert pd.isna(row["offset"]) and pd.isna(row["commit_len"])


def test_configs_table(df):
    c = configs_table(df)
    assert list(c.columns) == CONFIG_COLUMNS
    r = c.iloc[0].to_dict()
    assert (r["pool"], r["interval"], r["concurrency"], r["requests"]) == ("i256", 256, 1, 3)
    assert (r["exact"], r["soft"], r["hard"], r["error"]) == (1, 1, 1, 0)
    assert r["completion_tokens"] == 32
    assert r["wall_s"] == 2.0  # from t_start 1000.0 to the last end, 1000.5 + 1.5
    assert r["output_tok_s"] == 16.0
    assert r["ttft_p50_ms"] == pytest.approx(200.0)
    assert r["ttft_p90_ms"] == pytest.approx(280.0)
    assert r["e2e_p99_ms"] == pytest.approx(1490.0)
    assert r["accept_length_mean"] == 3.0


def test_write_tables_round_trip(df, tmp_path):
    write_tables(df, tmp_path)
    req = pd.read_csv(tmp_path / "requests.csv")
    assert list(req["class"]) == ["exact", "hard", "soft"]
    assert json.loads(req.loc[0, "crossings"])[0]["boundary"] == 256
    assert req.loc[1, "restored_verify_crossed"]
    b = pd.read_csv(tmp_path / "boundaries.csv")
    assert len(b) == 8
    assert len(pd.read_csv(tmp_path / "configs.csv")) == 1
    shapes = pd.read_csv(tmp_path / "tree_shapes.csv")  # no candidate records given: the header alone
    assert list(shapes.columns) == SHAPE_COLUMNS and shapes.empty


def test_empty_tables_have_columns():
    df = analyze([], {})
    assert list(boundaries_table(df).columns) == BOUNDARY_COLUMNS
    assert list(configs_table(df).columns) == CONFIG_COLUMNS


def test_boundaries_count_drift_and_onset_at_restore():
    from tests.reports.test_oracle import drifted

    p0 = prompt(250)
    p1 = p0 + list(range(65, 81)) + prompt(10, 5)
    records = [drifted(candidate(p1, [70] * 8, session_id="s", turn=1, cached_tokens=256), {0: 0.5}),
               reference(p1, [70] * 8)]
    cands = [r for r in records if r["role"] == "candidate"]
    b = boundaries_table(analyze(cands, {records[1]["input_hash"]: records[1]}))
    got = {r["boundary_kind"]: (r["offset"], r["drift"], r["drift_rate"], r["onset_at_restore"])
           for r in b.to_dict("records")}
    assert got == {"restored": (20, 1, 1.0, 1), "prompt": (20, 1, 1.0, 1), "drift_onset": (20, 1, 1.0, 1)}


def test_configs_table_sums_cache_counters_and_says_unknown(df):
    stats = [{"pool": "i256", "concurrency": 1, "counters": {"cache_hit_tokens": 256, "checkpoint_evictions": 2,
                                                             "kv_evicted_pages": None}},
             {"pool": "i256", "concurrency": 1, "counters": {"cache_hit_tokens": 128, "checkpoint_evictions": 0,
                                                             "kv_evicted_pages": 4}}]
    r = configs_table(df, stats).iloc[0].to_dict()
    assert (r["cache_hit_tokens"], r["checkpoint_evictions"], r["kv_evicted_pages"]) == (384, 2, "unknown")
    assert (r["variant"], r["flagged"], r["drift"], r["drift_max"]) == ("full", 1, 0, 0.0)
    assert (r["cells_crossed"], r["cells_restored"], r["cells"]) == (1, 1, 36)
    none = configs_table(df).iloc[0].to_dict()  # no stats records (an older run, or no /metrics)
    assert none["cache_hit_tokens"] == none["checkpoint_evictions"] == "unknown"
