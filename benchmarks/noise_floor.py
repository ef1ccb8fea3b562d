"""The noise floor of a run: log-prob drift of the turns that restored nothing, beside those that restored.

Reads a run directory's `requests.csv` (written by `python -m harness.run`) and prints, per
pool (the candidates `i<I>`, the --diagnose pools, the calibration's controls `ctl-i<I>-spec` and
`ctl-i<I>-cache`) and concurrency (`--by` other requests.csv columns, e.g. `variant,interval`):

* floor: requests with `cached_tokens == 0` (and class != error): count, max and p99 drift
  vs the cold reference, and their classes. On the bf16 engine this is path numerics alone
  (chunked prefill vs decode vs verify, bf16 rounding), the floor a tolerance must clear;
* restored: requests with `cached_tokens > 0`: count, min / median / p99 / max drift, how many
  changed a token, split by whether the restored checkpoint was taken inside a verify step
  (`restored_verify_crossed`, the #37817 class);
* restore window: restored turns' `window_drift` (the largest |candidate - reference| log-prob of the prompt
  tokens past their checkpoint, docs/reports.md "Restore windows"): what numerics alone move there.

p99 is the nearest-rank percentile (the smallest value at or above 99% of the values).

    python benchmarks/noise_floor.py runs/latest [--by concurrency]
"""

from __future__ import annotations

import argparse
import csv
import math
from collections import defaultdict
from pathlib import Path


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile q (0..100) of a non-empty list."""
    s = sorted(values)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def load(run_dir: str) -> list[dict]:
    """requests.csv rows with `drift` as a float (rows without a drift, e.g. errors, are dropped)."""
    path = Path(run_dir) / "requests.csv"
    if not path.exists():
        raise SystemExit(f"{path} not found: give a run directory written by python -m harness.run")
    rows = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["class"] == "error" or row["drift"] == "":
                continue
            row["drift"] = float(row["drift"])
            row["cached_tokens"] = int(row["cached_tokens"] or 0)
            rows.append(row)
    return rows


def _stats(rows: list[dict], field: str = "drift") -> str:
    d = [r[field] for r in rows]
    classes = defaultdict(int)
    for r in rows:
        classes[r["class"]] += 1
    cls = " ".join(f"{k} {v}" for k, v in sorted(classes.items()))
    return (f"n {len(d):4d}  min {min(d):.3g}  p50 {percentile(d, 50):.3g}  p99 {percentile(d, 99):.3g}  "
            f"max {max(d):.3g}  [{cls}]")


def report(rows: list[dict], group_keys: tuple[str, ...]) -> list[str]:
    """Floor and restored lines, grouped by `group_keys` (columns of requests.csv)."""
    lines = []
    for title, keep in (("floor (cached_tokens == 0)", lambda r: r["cached_tokens"] == 0),
                        ("restored (cached_tokens > 0)", lambda r: r["cached_tokens"] > 0)):
        lines.append(f"== {title}, by {', '.join(group_keys)}")
        groups = defaultdict(list)
        for r in rows:
            if keep(r):
                groups[tuple(r[k] for k in group_keys)].append(r)
        for key in sorted(groups, key=lambda k: tuple(int(x) if x.isdigit() else x for x in k)):
            lines.append(f"  {' '.join(key):24s} {_stats(groups[key])}")
        if not groups:
            lines.append("  (none)")
    windows = defaultdict(list)  # the restore window (reports/window.py): prompt tokens past the checkpoint
    for r in rows:
        if r.get("window_drift") not in (None, ""):
            windows[tuple(r[k] for k in group_keys)].append({**r, "window_drift": float(r["window_drift"])})
    if windows:
        lines.append(f"== restore window (window_drift of restored turns), by {', '.join(group_keys)}")
        for key in sorted(windows, key=lambda k: tuple(int(x) if x.isdigit() else x for x in k)):
            lines.append(f"  {' '.join(key):24s} {_stats(windows[key], 'window_drift')}")
    restored = [r for r in rows if r["cached_tokens"] > 0]
    for crossed in ("True", "False"):
        part = [r for r in restored if r.get("restored_verify_crossed") == crossed]
        if part:
            changed = sum(r["first_divergence"] != "" for r in part)
            lines.append(f"restored, verify-crossed checkpoint {crossed:5s}: {_stats(part)}; tokens changed {changed}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    ap.add_argument("--by", default="pool,concurrency",
                    help="comma-separated requests.csv columns to group by (default: pool,concurrency)")
    args = ap.parse_args()
    rows = load(args.run_dir)
    for line in report(rows, tuple(args.by.split(","))):
        print(line)


if __name__ == "__main__":
    main()
