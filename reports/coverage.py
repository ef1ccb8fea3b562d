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
from reports.frame_rows import records
from reports.oracle import FLAGGED

COVERAGE_COLUMNS = ["interval", "step", "commit_len", "crossed", "crossed_untracked", "restored",
                    "restored_flagged", "restored_untracked"]


def cells(block_size: int) -> list[tuple[int, int]]:
    """Every (step, commit_len) a verify step of `block_size` tokens can cross a boundary at."""
    return [(s, c) for c in range(1, block_size + 1) for s in range(c)]


def _block_sizes(df: pd.DataFrame) -> dict[int, int]:
    sizes = df.dropna(subset=["interval", "block_size"]).groupby("interval")["block_size"].max()
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


def coverage_table(df: pd.DataFrame) -> pd.DataFrame:
    """interval x every (step, commit_len) cell of its block size: requests that crossed / restored there."""
    hits = cell_hits(df) if len(df) else cell_hits(df.head(0))
    rows = []
    for interval, block in sorted(_block_sizes(df).items()) if len(df) else []:
        mine = hits[hits["interval"] == interval]
        for step, commit in cells(block):
            cell = mine[(mine["step"] == step) & (mine["commit_len"] == commit)]
            crossed, restored = cell[cell["kind"] == "crossed"], cell[cell["kind"] == "restored"]
            rows.append({"interval": interval, "step": step, "commit_len": commit, "crossed": len(crossed),
                         "crossed_untracked": int(crossed["untracked"].sum()), "restored": len(restored),
                         "restored_flagged": int(restored["flagged"].sum()),
                         "restored_untracked": int(restored["untracked"].sum())})
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
