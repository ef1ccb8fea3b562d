"""Coverage of the boundary cases: which (verify step holding the boundary, commit length) cells a run reached.

A verify step of commit length c (1..B) crosses a boundary at step s (0..c-1, the
step whose state belongs at the boundary), so a block size B has B(B+1)/2 cells.
A cell is *crossed* when some request's own verify step crossed a boundary there,
and *restored* when a later turn restored the checkpoint of such a crossing (the
path #37817 broke). Reported crossings only (`spec_trace`).
"""

from __future__ import annotations

import pandas as pd

from reports.crossing_cells import crossing_list
from reports.frame_rows import ROWS, records
from reports.oracle import FLAGGED

COVERAGE_COLUMNS = ["interval", "step", "commit_len", "crossed", "crossed_untracked", "restored",
                    "restored_flagged", "restored_untracked"]


def cells(block_size: int) -> list[tuple[int, int]]:
    """Every (step, commit_len) a verify step of `block_size` tokens can cross a boundary at."""
    return [(s, c) for c in range(1, block_size + 1) for s in range(c)]


def _block_sizes(df: pd.DataFrame) -> dict[int, int]:
    sizes = df[["interval", "block_size"]].dropna().groupby("interval")["block_size"].max()  # not a copy of df
    return {int(i): int(b) for i, b in sizes.items()}


_HIT_COLUMNS = ["key", "interval", "class", "crossings", "restored_verify_crossed", "restored_crossing_tracked",
                "restored_crossing_step", "restored_crossing_commit_len"]


def cell_hits(df: pd.DataFrame) -> pd.DataFrame:
    """Long form: one row per (request, kind, step, commit_len) with kind `crossed` or `restored`."""
    rows = []
    for r in records(df, _HIT_COLUMNS):  # only the columns read: the frame has 60
        if pd.isna(r["interval"]):
            continue
        flagged = r["class"] in FLAGGED
        for x in crossing_list(r["crossings"]):
            if x["source"] == "reported":
                rows.append((r["key"], int(r["interval"]), "crossed", x["step"], x["commit_len"],
                             x["tracked_agrees"] is False, flagged))
        if r["restored_verify_crossed"]:
            tracked = r["restored_crossing_tracked"]
            rows.append((r["key"], int(r["interval"]), "restored", int(r["restored_crossing_step"]),
                         int(r["restored_crossing_commit_len"]), (not pd.isna(tracked)) and not tracked, flagged))
    out = pd.DataFrame(rows, columns=["key", "interval", "kind", "step", "commit_len", "untracked", "flagged"])
    return out.drop_duplicates(subset=["key", "kind", "step", "commit_len"])


_CELL = ["interval", "kind", "step", "commit_len"]


def _cell_counts(df: pd.DataFrame) -> dict[tuple, tuple[int, int, int]]:
    """(interval, kind, step, commit_len) -> (requests, untracked, flagged) of cell_hits, counted ROWS requests
    at a time (a request's hits are all in its own slice): the hits of a whole run at once are a row per
    crossing."""
    parts = []
    for start in range(0, len(df), ROWS):
        hits = cell_hits(df.iloc[start:start + ROWS])
        if len(hits):
            parts.append(hits.assign(n=1).groupby(_CELL)[["n", "untracked", "flagged"]].sum())
    if not parts:
        return {}
    total = pd.concat(parts).groupby(level=list(range(len(_CELL)))).sum()
    return {key: (int(n), int(u), int(f)) for key, n, u, f in
            zip(total.index, total["n"], total["untracked"], total["flagged"], strict=True)}


def coverage_table(df: pd.DataFrame) -> pd.DataFrame:
    """interval x every (step, commit_len) cell of its block size: requests that crossed / restored there."""
    counts = _cell_counts(df)
    rows = []
    for interval, block in sorted(_block_sizes(df).items()) if len(df) else []:
        for step, commit in cells(block):
            crossed = counts.get((interval, "crossed", step, commit), (0, 0, 0))
            restored = counts.get((interval, "restored", step, commit), (0, 0, 0))
            rows.append({"interval": interval, "step": step, "commit_len": commit, "crossed": crossed[0],
                         "crossed_untracked": crossed[1], "restored": restored[0], "restored_flagged": restored[2],
                         "restored_untracked": restored[1]})
    return pd.DataFrame(rows, columns=COVERAGE_COLUMNS)


def coverage_summary(coverage: pd.DataFrame) -> list[dict]:
    """Per interval: cells, cells crossed, cells restored, restored cells with a flagged request."""
    out = []
    for interval, g in coverage.groupby("interval", sort=True):
        out.append({"interval": int(interval), "cells": len(g), "crossed": int((g["crossed"] > 0).sum()),
                    "restored": int((g["restored"] > 0).sum()),
                    "restored_flagged": int((g["restored_flagged"] > 0).sum())})
    return out


def cells_reached(df: pd.DataFrame) -> tuple[int, int]:
    """(distinct cells crossed, distinct cells restored) among the rows of `df` (one sweep point)."""
    hits = cell_hits(df)
    crossed = hits[hits["kind"] == "crossed"][["step", "commit_len"]].drop_duplicates()
    restored = hits[hits["kind"] == "restored"][["step", "commit_len"]].drop_duplicates()
    return len(crossed), len(restored)
