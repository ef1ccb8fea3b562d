"""The run's CSV tables (pandas): requests, per-boundary counts, per-sweep-point performance.

Column meanings are documented in docs/reports.md.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from protocol.boundaries import nearest_boundary_offset
from records.reader import RunReader
from records.rundir import load_config
from records.schema import CACHE_COUNTERS, POINTS_FILE, point_label
from reports.analyze import REQUEST_COLUMNS
from reports.coverage import cells, cells_reached, coverage_table
from reports.crossing_cells import crossing_list
from reports.escape import CSV_FORMULA, csv_cell
from reports.frame_rows import ROWS, records
from reports.latency import LATENCY_COLUMNS, empty_latency, latency_of_points, parse_slo, request_latency
from reports.oracle import CLASSES, FLAGGED
from reports.tree_shapes import SHAPE_COLUMNS, request_shapes, shapes_table
from reports.window import WINDOW_COLUMNS

# Boundary kinds, in report order (docs/reports.md says what offset and commit_len mean for each).
BOUNDARY_KINDS = ("restored", "restored_verify", "restored_position", "restored_prefill", "crossed_verify",
                  "crossed_inferred", "prompt", "drift_onset", "divergence")

BOUNDARY_COLUMNS = ["interval", "boundary_kind", "offset", "commit_len", "requests", *CLASSES,
                    "hard_rate", "drift_rate", "soft_rate", "untracked", "onset_at_restore"]

CONFIG_COLUMNS = [
    "pool", "variant", "interval", "point", "concurrency", "request_rate", "requests", *CLASSES, "flagged",
    "hard_rate", "drift_rate", "soft_rate", "drift_max", *CACHE_COUNTERS, "cells_crossed", "cells_restored", "cells",
    "completion_tokens", "wall_s", "output_tok_s", *LATENCY_COLUMNS, "accept_length_mean",
    "warmup", "unsent", "stopped",
]
UNKNOWN = "unknown"  # a cache counter the server does not expose (or no stats were recorded)


def _na(v):
    return None if v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v)) else v


_ATTRIBUTION_COLUMNS = ["key", "interval", "class", "onset_points_at", "prompt_offset", "restored", "restored_offset",
                        "restored_verify_crossed", "restored_crossing_step", "restored_crossing_commit_len",
                        "restored_crossing_tracked", "restored_link", "cached_tokens", "crossings", "drift_onset",
                        "drift_onset_offset", "first_divergence", "divergence_offset"]


def attributions(df: pd.DataFrame) -> pd.DataFrame:
    """Long form: one row per (request, boundary kind, offset, commit_len) it is attributed to."""
    rows = []
    for r in records(df, _ATTRIBUTION_COLUMNS):  # only the columns read: the frame has 60
        interval = _na(r["interval"])
        if interval is None:
            continue
        base = {"key": r["key"], "interval": interval, "class": r["class"],
                "onset_at_restore": r["onset_points_at"] == "restored_checkpoint"}

        def add(kind, offset, commit_len=None, untracked=False, base=base):
            rows.append({**base, "boundary_kind": kind, "offset": _na(offset), "commit_len": _na(commit_len),
                         "untracked": bool(untracked)})

        add("prompt", r["prompt_offset"])
        if r["restored"]:
            add("restored", r["restored_offset"])
        if r["restored_verify_crossed"]:
            add("restored_verify", r["restored_crossing_step"], r["restored_crossing_commit_len"],
                _na(r["restored_crossing_tracked"]) is False)
        elif r["restored_link"] == "position":  # verify steps not reported: which step and commit is unknown
            add("restored_position", None, None)
        elif r["restored_link"] == "prefill":  # the previous turn's prefill checkpoint: offset from the I grid
            add("restored_prefill", nearest_boundary_offset(int(r["cached_tokens"]), int(interval)))
        for x in crossing_list(r["crossings"]):
            if x["source"] == "reported":
                add("crossed_verify", x["step"], x["commit_len"], x["tracked_agrees"] is False)
            else:
                add("crossed_inferred", None, None)
        if _na(r["drift_onset"]) is not None:
            add("drift_onset", r["drift_onset_offset"])
        if _na(r["first_divergence"]) is not None:
            add("divergence", r["divergence_offset"])
    cols = ["key", "interval", "class", "onset_at_restore", "boundary_kind", "offset", "commit_len", "untracked"]
    out = pd.DataFrame(rows, columns=cols)
    for col in ("interval", "offset", "commit_len"):
        out[col] = pd.to_numeric(out[col], errors="coerce").astype("Float64").round().astype("Int64")
    # A request counts once per cell even if it crossed two boundaries with the same step and commit.
    return out.drop_duplicates(subset=["key", "boundary_kind", "offset", "commit_len"])


def _class_counts(group: pd.DataFrame) -> dict:
    counts = group["class"].value_counts()
    n = len(group)
    out = {"requests": n, **{c: int(counts.get(c, 0)) for c in CLASSES}}
    out["hard_rate"] = out["hard"] / n if n else np.nan
    out["drift_rate"] = out["drift"] / n if n else np.nan
    out["soft_rate"] = out["soft"] / n if n else np.nan
    return out


_COUNTED = ["requests", *CLASSES, "untracked", "onset_at_restore"]  # summed over a boundary cell's requests


def boundaries_table(df: pd.DataFrame) -> pd.DataFrame:
    """interval x boundary_kind x offset x commit_len: requests, class counts, rates, untracked crossings.
    Counted ROWS requests at a time (a request's attributions are all in its own slice): the attributions of a
    whole run at once are several rows per request."""
    keys = ["interval", "boundary_kind", "offset", "commit_len"]
    parts = []
    for start in range(0, len(df), ROWS):
        att = attributions(df.iloc[start:start + ROWS])
        if len(att):
            att = att.assign(requests=1, **{c: att["class"] == c for c in CLASSES})
            parts.append(att.groupby(keys, dropna=False, sort=False)[_COUNTED].sum().reset_index())
    if not parts:
        return pd.DataFrame(columns=BOUNDARY_COLUMNS)
    out = pd.concat(parts, ignore_index=True).groupby(keys, dropna=False, sort=False)[_COUNTED].sum().reset_index()
    for c in ("hard", "drift", "soft"):
        out[f"{c}_rate"] = out[c] / out["requests"]
    out = out[BOUNDARY_COLUMNS]
    out["kind_order"] = out["boundary_kind"].map({k: i for i, k in enumerate(BOUNDARY_KINDS)})
    out = out.sort_values(["interval", "kind_order", "offset", "commit_len"], na_position="first")
    out = out.drop(columns="kind_order").reset_index(drop=True)
    for col in ("interval", "offset", "commit_len"):
        out[col] = out[col].astype("Int64")
    return out


def _label(rec: dict) -> str:
    """The sweep point label of a record (a stats record's from its key `stats/<pool>-<point>/<replica>`)."""
    key = str(rec.get("key") or "")
    if key.startswith("stats/") and key.count("/") == 2 and key.split("/")[1].startswith(f"{rec.get('pool')}-"):
        return key.split("/")[1][len(str(rec.get("pool"))) + 1:]
    return point_label(rec) or f"c{_na(rec.get('concurrency'))}"


def cache_figures(stats: list[dict] | None) -> dict[tuple, dict]:
    """(pool, point label) -> each cache counter summed over the point's replicas, UNKNOWN where any is missing."""
    out: dict[tuple, dict] = {}
    for rec in stats or []:
        point = out.setdefault((rec.get("pool"), _label(rec)), dict.fromkeys(CACHE_COUNTERS, 0))
        counters = rec.get("counters") or {}
        for name in CACHE_COUNTERS:
            value = counters.get(name)
            point[name] = UNKNOWN if value is None or point[name] == UNKNOWN else point[name] + int(value)
    return out


def _point_sort(label: str) -> tuple:
    """Concurrency points first, then rate points, each by their number."""
    return (label[:1] != "c", float(label[1:]) if label[1:].replace(".", "", 1).isdigit() else math.inf, label)


def configs_table(df: pd.DataFrame, stats: list[dict] | None = None, candidates: list[dict] | None = None,
                  points: list[dict] | None = None, slo: dict[str, float] | None = None,
                  latency: pd.DataFrame | None = None) -> pd.DataFrame:
    """pool/interval x sweep point: class counts, drift, cache counters (from `stats` records), cells reached,
    output tok/s over the point's wall span, latency (reports/latency.py: from `latency`, the candidates'
    request_latency rows, else from `candidates`, else from `df`'s timings) with `slo` attainment, and what the
    point's record (`points`) says of its warmup and early stop."""
    if df.empty:
        return pd.DataFrame(columns=CONFIG_COLUMNS)
    figures = cache_figures(stats)
    if latency is None:
        latency = request_latency(candidates if candidates is not None else df.to_dict("records"))
    latency = latency_of_points(latency, slo)
    done = {(p.get("pool"), p.get("point")): p for p in points or []}
    blocks = df[["pool", "block_size"]].dropna(subset=["block_size"]).groupby("pool")["block_size"].max().to_dict()
    labels: dict[str, str] = {}  # one string per label, not one per row
    df = df.assign(point=[labels.setdefault(lab := _label(r), lab)
                          for r in records(df, ["key", "pool", "concurrency"])])
    rows = []
    # one group at a time (sorting the groups themselves would hold every one of them at once), the rows then
    # put in the order the groups sort in (a stable sort of the groupby's own order)
    for (pool, interval, label), g in df.groupby(["pool", "interval", "point"], dropna=False, sort=True):
        ok = g[g["class"] != "error"]
        tokens = int(ok["completion_tokens"].fillna(0).sum())
        ends = (g["t_start"] + g["e2e"]).dropna()
        starts = g["t_start"].dropna()
        wall = float(ends.max() - starts.min()) if len(ends) and len(starts) else np.nan
        crossed, restored = cells_reached(g)
        drift = ok["drift"].dropna()
        cache = figures.get((pool, label), dict.fromkeys(CACHE_COUNTERS, UNKNOWN))
        lat = latency.get((pool, label)) or empty_latency()
        rec = done.get((pool, label)) or {}
        row = {"pool": pool, "variant": g["variant"].iloc[0], "interval": interval, "point": label,
               "concurrency": g["concurrency"].dropna().iloc[0] if g["concurrency"].notna().any() else pd.NA,
               "request_rate": lat["offered_rps"],
               **_class_counts(g), "flagged": int(g["class"].isin(FLAGGED).sum()),
               "drift_max": float(drift.max()) if len(drift) else np.nan, **cache,
               "cells_crossed": crossed, "cells_restored": restored,
               "cells": len(cells(int(blocks[pool]))) if pool in blocks else np.nan,
               "completion_tokens": tokens, "wall_s": wall,
               "output_tok_s": tokens / wall if wall and wall > 0 else np.nan, **lat,
               "warmup": rec.get("warmup", 0), "unsent": rec.get("unsent", 0), "stopped": rec.get("stopped") or ""}
        accept = pd.to_numeric(ok["spec_accept_length"], errors="coerce").dropna()
        row["accept_length_mean"] = float(accept.mean()) if len(accept) else np.nan
        rows.append(row)
    rows.sort(key=lambda r: (str(r["pool"]), _point_sort(r["point"])))
    out = pd.DataFrame(rows, columns=CONFIG_COLUMNS)
    for col in ("interval", "concurrency"):
        out[col] = out[col].astype("Int64")
    return out


def requests_table(df: pd.DataFrame) -> pd.DataFrame:
    """The requests frame's columns written to CSV."""
    return df[REQUEST_COLUMNS + [c for c in WINDOW_COLUMNS if c in df]]


def write_tables(df: pd.DataFrame, run_dir: str | Path, stats: list[dict] | None = None,
                 candidates: list[dict] | None = None, shapes: pd.DataFrame | None = None,
                 latency: pd.DataFrame | None = None) -> dict[str, pd.DataFrame]:
    """Write requests.csv, boundaries.csv, configs.csv, coverage.csv and tree_shapes.csv (from `shapes`, the
    per-request tree shapes, else from the candidate records' ids: reports/tree_shapes.py; empty without them)
    into `run_dir`; return the frames but requests.csv's. configs.csv takes the run's point records and its
    config.json's --slo from `run_dir`; `latency`: the candidates' request_latency rows (else from `candidates`,
    else from `df`)."""
    run_dir = Path(run_dir)
    if shapes is None and candidates:
        shapes = request_shapes(candidates)
    shapes = shapes_table(shapes, df) if shapes is not None else pd.DataFrame(columns=SHAPE_COLUMNS)
    slo = parse_slo((load_config(run_dir).get("run_config") or {}).get("slo"))
    configs = configs_table(df, stats, candidates, point_records(run_dir), slo, latency)
    write_requests(df, run_dir / "requests.csv")
    tables = {"boundaries": boundaries_table(df), "configs": configs, "coverage": coverage_table(df),
              "tree_shapes": shapes}
    for name, table in tables.items():
        csv_safe(table).to_csv(run_dir / f"{name}.csv", index=False, float_format="%.6g")
    return tables


def write_requests(df: pd.DataFrame, path: Path) -> None:
    """requests.csv (requests_table, csv_safe), written ROWS rows at a time: the whole table at once would be a
    copy of the frame."""
    with open(path, "w", encoding="utf-8", newline="") as f:
        for start in range(0, max(len(df), 1), ROWS):
            csv_safe(requests_table(df.iloc[start:start + ROWS])).to_csv(f, index=False, header=not start,
                                                                         float_format="%.6g")


def point_records(run_dir: Path) -> list[dict]:
    """The run's sweep point records (role "point", records/schema.py POINTS_FILE); none in older runs."""
    reader = RunReader(run_dir)
    stem = Path(POINTS_FILE).stem
    return list(reader.records(stem, set())) if stem in reader.stems() else []


def csv_safe(table: pd.DataFrame) -> pd.DataFrame:
    """The table with text cells that a spreadsheet would run as formulas quoted (reports/escape.py); pandas
    quotes separators, quotes and line breaks itself."""
    out = {}
    for c in table.columns:
        col = table[c]
        if col.dtype == object:
            out[c] = col.map(csv_cell)
        elif pd.api.types.is_string_dtype(col):  # text columns: only the cells that need it, without a Python
            hit = col.str.startswith(CSV_FORMULA).fillna(False).astype(bool)  # string per cell
            if hit.any():
                out[c] = col.where(~hit, "'" + col)
    return table.assign(**out) if out else table
