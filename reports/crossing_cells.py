"""The `crossings` cell of the requests frame and requests.csv: a request's boundary crossings as JSON text, one
object per crossing (reports/analyze.py crossing_dict), text in the frame as in the CSV (a list of dicts per row
costs a few hundred bytes a request)."""

from __future__ import annotations

import json


def crossings_json(crossings: list[dict]) -> str:
    """The cell of a request's crossings."""
    return json.dumps(crossings, separators=(",", ":"))


def crossing_list(cell) -> list[dict]:
    """A cell's crossings (a list given as it is); none for an empty cell."""
    if isinstance(cell, str):
        return json.loads(cell)
    return list(cell) if isinstance(cell, list) else []
