"""The run's CSV tables (pandas): requests, per-boundary counts, per-sweep-point performance.

Column meanings are documented in docs/reports.md.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from reports.analyze import REQUEST_COLUMNS, crossings_json
from reports.oracle import CLASSES

# Boundary kinds, in report order (docs/reports.md says what offset and commit_len mean for each).
BOUNDARY_KINDS = ("restored", "restored_verify", "crossed_verify", "crossed_inferred", "prompt", "divergence")

BOUNDARY_COLUMNS = ["interval", "boundary_kind", "offset", "commit_len", "requests", *CLASSES,
                    "hard_rate", "soft_rate", "untracked"]

CONFIG_COLUMNS = [
    "pool", "interval", "concurrency", "requests", *CLASSES, "hard_rate", "soft_rate",
    "completion_tokens", "wall_s", "output_tok_s",
    "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p90_ms", "itl_p99_ms",
    "e2e_p50_ms", "e2e_p90_ms", "e2e_p99_ms", "accept_length_mean",
]


def _na(v):
    return None if v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v)) else v


def attributions(df: pd.DataFrame) -> pd.DataFrame:
    """Long form: one row per (request, boundary kind, offset, commit_len) it is attributed to."""
    rows = []
    for r in df.to_dict("records"):
        interval = _na(r["interval"])
        if interval is None:
            continue
        base = {"key": r["key"], "interval": interval, "class": r["class"]}

        def add(kind, offset, commit_len=None, untracked=False, base=base):
            rows.append({**base, "boundary_kind": kind, "offset": _na(offset), "commit_len": _na(commit_len),
                         "untracked": bool(untracked)})

        add("prompt", r["prompt_offset"])
        if r["restored"]:
            add("restored", r["restored_offset"])
        if r["restored_verify_crossed"]:
            add("restored_verify", r["restored_crossing_step"], r["restored_crossing_commit_len"],
                _na(r["restored_crossing_tracked"]) is False)
        for x in r["crossings"]:
            if x["source"] == "reported":
                add("crossed_verify", x["step"], x["commit_len"], x["tracked_agrees"] is False)
            else:
                add("crossed_inferred", None, None)
        if _na(r["first_divergence"]) is not None:
            add("divergence", r["divergence_offset"])
    cols = ["key", "interval", "class", "boundary_kind", "offset", "commit_len", "untracked"]
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
    out["soft_rate"] = out["soft"] / n if n else np.nan
    return out


def boundaries_table(df: pd.DataFrame) -> pd.DataFrame:
    """interval x boundary_kind x offset x commit_len: requests, class counts, rates, untracked crossings."""
    att = attributions(df)
    if att.empty:
        return pd.DataFrame(columns=BOUNDARY_COLUMNS)
    rows = []
    keys = ["interval", "boundary_kind", "offset", "commit_len"]
    for key, group in att.groupby(keys, dropna=False, sort=False):
        cell = dict(zip(keys, key, strict=True))
        rows.append({**cell, **_class_counts(group), "untracked": int(group["untracked"].sum())})
    out = pd.DataFrame(rows, columns=BOUNDARY_COLUMNS)
    out["kind_order"] = out["boundary_kind"].map({k: i for i, k in enumerate(BOUNDARY_KINDS)})
    out = out.sort_values(["interval", "kind_order", "offset", "commit_len"], na_position="first")
    out = out.drop(columns="kind_order").reset_index(drop=True)
    for col in ("interval", "offset", "commit_len"):
        out[col] = out[col].astype("Int64")
    return out


def _pct_ms(values: pd.Series, q: float) -> float:
    v = pd.to_numeric(values, errors="coerce").dropna()
    return float(np.percentile(v, q) * 1000.0) if len(v) else np.nan


def configs_table(df: pd.DataFrame) -> pd.DataFrame:
    """pool/interval x concurrency: class counts, output tok/s over the sweep point's wall span, latency percentiles."""
    if df.empty:
        return pd.DataFrame(columns=CONFIG_COLUMNS)
    rows = []
    for (pool, interval, conc), g in df.groupby(["pool", "interval", "concurrency"], dropna=False, sort=True):
        ok = g[g["class"] != "error"]
        tokens = int(ok["completion_tokens"].fillna(0).sum())
        ends = (g["t_start"] + g["e2e"]).dropna()
        starts = g["t_start"].dropna()
        wall = float(ends.max() - starts.min()) if len(ends) and len(starts) else np.nan
        row = {"pool": pool, "interval": interval, "concurrency": conc, **_class_counts(g),
               "completion_tokens": tokens, "wall_s": wall,
               "output_tok_s": tokens / wall if wall and wall > 0 else np.nan}
        for metric in ("ttft", "itl", "e2e"):
            for q in (50, 90, 99):
                row[f"{metric}_p{q}_ms"] = _pct_ms(ok[metric], q)
        accept = pd.to_numeric(ok["spec_accept_length"], errors="coerce").dropna()
        row["accept_length_mean"] = float(accept.mean()) if len(accept) else np.nan
        rows.append(row)
    out = pd.DataFrame(rows, columns=CONFIG_COLUMNS)
    for col in ("interval", "concurrency"):
        out[col] = out[col].astype("Int64")
    return out


def requests_table(df: pd.DataFrame) -> pd.DataFrame:
    """The requests frame as written to CSV (crossings as JSON)."""
    out = df[REQUEST_COLUMNS].copy()
    out["crossings"] = out["crossings"].map(crossings_json)
    return out


def write_tables(df: pd.DataFrame, run_dir: str | Path) -> dict[str, pd.DataFrame]:
    """Write requests.csv, boundaries.csv and configs.csv into `run_dir`; return the three frames."""
    run_dir = Path(run_dir)
    tables = {"requests": requests_table(df), "boundaries": boundaries_table(df), "configs": configs_table(df)}
    for name, table in tables.items():
        table.to_csv(run_dir / f"{name}.csv", index=False, float_format="%.6g")
    return tables
