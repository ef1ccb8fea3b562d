"""What the report makes a slice of the frame at a time equals what it made of the whole frame at once: the
frame's chunks joined, its rows as dicts, requests.csv, and the judged frame put back together."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import reports.frame_rows as frame_rows
import reports.tables as tables
from reports.analyze import REQUEST_COLUMNS, chunk_frame, frames_joined
from reports.render import rejoined
from reports.tables import csv_safe, requests_table
from tests.reports.test_tables import df  # noqa: F401  (the module's fixture)


def _cols(values: dict[str, list], n: int) -> dict[str, list]:
    cols = {c: [None] * n for c in REQUEST_COLUMNS}
    cols["crossings"] = ["[]"] * n
    cols.update(values)
    return cols


def _whole(parts: list[dict[str, list]]) -> dict[str, list]:
    return {c: [v for p in parts for v in p[c]] for c in REQUEST_COLUMNS}


@pytest.mark.parametrize("texts", [
    (["a", None], [None, None], ["=b", "c"]),  # text where any chunk has text
    (["a", None], [{"x": 1}, None], ["c", "d"]),  # a chunk with other values: an object column, None where missing
    ([None, None], [None, None], [None, None]),  # nothing: stays an object column of None
])
def test_chunks_joined_equal_one_frame(texts):
    parts = [_cols({"key": [f"k{i}{j}" for j in range(2)], "error": list(t), "turn": [i, None]}, 2)
             for i, t in enumerate(texts)]
    links = {"restored_link": ["prefill"] + [None] * 5, "restored_verify_crossed": [False] * 6,
             "restored_crossing_step": [None] * 6, "restored_crossing_commit_len": [None] * 6,
             "restored_crossing_tracked": [None] * 6}
    whole = _whole(parts)
    whole.update(links)
    expected = chunk_frame({c: whole[c] for c in REQUEST_COLUMNS})
    for col in REQUEST_COLUMNS:  # what one frame of every row's lists makes a text column
        values = expected[col].dropna()
        if expected[col].dtype == object and col != "crossings" and len(values) \
                and all(isinstance(v, str) for v in values):
            expected[col] = expected[col].astype("str")
    got = frames_joined([chunk_frame(p) for p in parts], links)
    pd.testing.assert_frame_equal(got, expected)
    assert [type(v) for v in got["error"]] == [type(v) for v in expected["error"]]


def test_records_in_slices_equal_to_dict(df, monkeypatch):  # noqa: F811
    monkeypatch.setattr(frame_rows, "ROWS", 2)
    cols = ["key", "class", "drift", "cached_tokens"]
    assert list(frame_rows.records(df, cols)) == df[cols].to_dict("records")
    pd.testing.assert_frame_equal(pd.DataFrame(list(frame_rows.records(df))), pd.DataFrame(df.to_dict("records")))
    assert list(frame_rows.records(df.iloc[:0], cols)) == []


@pytest.mark.parametrize("rows", [1, 2, 3, 8192])
def test_requests_csv_in_slices(df, tmp_path, monkeypatch, rows):  # noqa: F811
    monkeypatch.setattr(tables, "ROWS", rows)
    frame = df.assign(detail=["=1+1", "plain", None])
    tables.write_requests(frame, tmp_path / "requests.csv")
    csv_safe(requests_table(frame)).to_csv(tmp_path / "whole.csv", index=False, float_format="%.6g")
    assert (tmp_path / "requests.csv").read_bytes() == (tmp_path / "whole.csv").read_bytes()
    tables.write_requests(frame.iloc[:0], tmp_path / "empty.csv")
    assert (tmp_path / "empty.csv").read_text().strip() == ",".join(requests_table(frame).columns)


def test_rejoined_equals_concat(df):  # noqa: F811
    frame = pd.concat([df] * 3, ignore_index=True)
    control = pd.Series(np.arange(len(frame)) % 3 == 1, index=frame.index)
    part = frame[~control]
    part = part.assign(**{"class": part["class"].where(part["class"] != "hard", "path_numerics"),
                          "unjudged_pool": part["pool"].astype(str) == "x"})
    got = rejoined(frame, part, control)
    pd.testing.assert_frame_equal(got, pd.concat([part, frame[control]]).loc[frame.index])
    assert got["key"].array is frame["key"].array or got["key"].equals(frame["key"])
    dropped = part.drop(columns=["detail"])
    pd.testing.assert_frame_equal(rejoined(frame, dropped, control),
                                  pd.concat([dropped, frame[control]]).loc[frame.index])


def test_chunks_joined_a_column_at_a_time_equal_one_frame():
    rng = np.random.default_rng(7)
    parts = []
    for i, n in enumerate([3, 1, 4]):  # numbers, missing numbers, floats and text, a chunk with none of some
        parts.append(_cols({"key": [f"k{i}{j}" for j in range(n)],
                            "turn": [None] * n if i == 1 else rng.integers(0, 5, n).tolist(),
                            "drift": [None] * n if i == 2 else rng.random(n).tolist(),
                            "restored": rng.random(n).tolist() if i == 0 else [False] * n,
                            "detail": [None] * n if i == 0 else [f"d{j}" for j in range(n)]}, n))
    links = {"restored_link": [None, "prefill"] * 4, "restored_verify_crossed": [False] * 8,
             "restored_crossing_step": [None] * 7 + [3], "restored_crossing_commit_len": [None] * 8,
             "restored_crossing_tracked": [None] * 6 + [True, False]}
    whole = _whole(parts)
    whole.update(links)
    expected = chunk_frame({c: whole[c] for c in REQUEST_COLUMNS})
    chunks = [chunk_frame(p) for p in parts]
    got = frames_joined(chunks, links)
    assert chunks == []  # each chunk's columns were handed on as they were joined
    pd.testing.assert_frame_equal(got, expected)
