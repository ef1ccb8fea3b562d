"""A requests frame's rows as dicts, a slice at a time: `to_dict("records")` over a million rows holds a million
dicts at once."""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd

ROWS = 8192  # rows made into dicts at once


def records(df: pd.DataFrame, columns: list[str] | None = None) -> Iterator[dict]:
    """`df[columns].to_dict("records")`, the same dicts in order, made ROWS at a time."""
    part = df if columns is None else df[columns]
    for start in range(0, len(part), ROWS):
        yield from part.iloc[start:start + ROWS].to_dict("records")
