"""Each registered fault in bf16 against the turns it affects: the figures of docs/reports.md's fault table.

For every fault it runs the same command twice, in fp32 (the exact target) and in bf16 (calibrated against the
controls), plus a clean bf16 run, and prints per fault: the bf16 verdict, the affected turns and how many of them
the bf16 gate flagged, what it flagged outside them, and how many were flagged by their restore window
(reports/window.py). The affected turns are the ones the exact fp32 oracle flags in the fp32 run of the same fault
(every structural fault acts on the same turns in both dtypes); for a fault that depends on batch timing
(`track-dropped-on-batch-change`) they are the bf16 run's own turns that restored a verify crossing its engine did
not copy, since its batches are not the fp32 run's. Runs already in RUNS_DIR are reused with --reuse.

    python benchmarks/fault_matrix.py [--intervals 128] [--concurrency 4] [--seed 0] [--clean-seeds 0,1,2]
                                      [--faults a,b] [--runs-dir runs/fault-matrix] [--reuse]
                                      [-- extra harness.run flags]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.faults import EVICT_MATCHED_CHECKPOINT, FAULTS, TRACK_DROPPED_ON_BATCH_CHANGE  # noqa: E402

TIMING_FAULTS = {TRACK_DROPPED_ON_BATCH_CHANGE}
# a fault that only acts under cache pressure runs with a state pool small enough to evict
FAULT_ARGS = {EVICT_MATCHED_CHECKPOINT: ["--candidate-args", "--max-state-slots 16"]}
FLAGGED = ("drift", "hard")


def run(runs: Path, run_id: str, args: list[str], reuse: bool) -> tuple[int | None, float]:
    """harness.run into runs/run_id (its exit status and seconds; None, 0 when reused)."""
    if reuse and (runs / run_id / "requests.csv").exists():
        return None, 0.0
    cmd = [sys.executable, "-m", "harness.run", "--runs-dir", str(runs), "--run-id", run_id, "--no-progress", *args]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode not in (0, 1, 3):
        print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
    return proc.returncode, time.monotonic() - t0


def gated(run_dir: Path) -> pd.DataFrame:
    df = pd.read_csv(run_dir / "requests.csv")
    return df[~df["pool"].astype(str).str.startswith("ctl-") & (df["pool"] != "baseline")]


def headline(run_dir: Path) -> str:
    lines = (run_dir / "summary.md").read_text().splitlines()
    return lines[2].strip("*") if len(lines) > 2 else "?"


def affected(fault: str | None, fp32: pd.DataFrame, bf16: pd.DataFrame) -> set[str]:
    if fault is None:
        return set()
    if fault in TIMING_FAULTS:
        own = bf16[bf16["restored_verify_crossed"].fillna(False).astype(bool)
                   & ~bf16["restored_crossing_tracked"].fillna(True).astype(bool)]
        return set(own["key"])
    return set(fp32.loc[fp32["class"].isin(FLAGGED), "key"])


def row(runs: Path, fault: str | None, name: str) -> dict:
    bf16_dir = runs / f"bf16-{name}"
    bf16 = gated(bf16_dir)
    fp32 = gated(runs / f"fp32-{name}") if fault else bf16.iloc[:0]
    hit = affected(fault, fp32, bf16)
    flagged = set(bf16.loc[bf16["class"].isin(FLAGGED), "key"])
    window = set(bf16.loc[bf16.get("window_status", pd.Series(dtype=object)).eq("flagged")
                          & bf16["class"].isin(FLAGGED), "key"]) if "window_status" in bf16 else set()
    return {"fault": name, "verdict": headline(bf16_dir), "affected": len(hit),
            "flagged_affected": len(flagged & hit), "share": f"{len(flagged & hit) / len(hit):.0%}" if hit else "",
            "flagged_outside": len(flagged - hit), "window_flagged": len(window & hit)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--intervals", default="128")
    parser.add_argument("--concurrency", default="4")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--clean-seeds", default=None, help="comma-separated seeds of the clean bf16 runs "
                        "(default: --seed)")
    parser.add_argument("--faults", default="all", help="comma-separated fault names, or all")
    parser.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "fault-matrix")
    parser.add_argument("--reuse", action="store_true", help="keep runs already in RUNS_DIR")
    parser.add_argument("extra", nargs="*", help="more harness.run flags (after --)")
    args = parser.parse_args(argv)
    faults = list(FAULTS) if args.faults == "all" else args.faults.split(",")
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        parser.error(f"unknown fault(s) {', '.join(unknown)}; registered: {', '.join(FAULTS)}")
    base = ["--intervals", args.intervals, "--concurrency", args.concurrency, *args.extra]
    args.runs_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    seeds = [int(x) for x in (args.clean_seeds or str(args.seed)).split(",")]
    for fault, seed in [(None, s) for s in seeds] + [(f, args.seed) for f in faults]:
        name = fault or ("clean" if seeds == [args.seed] else f"clean-s{seed}")
        fault_args = ["--inject-fault", fault, *FAULT_ARGS.get(fault, [])] if fault else []
        flags = [*base, "--seed", str(seed), *fault_args]
        if fault:
            code, took = run(args.runs_dir, f"fp32-{name}", flags, args.reuse)
            print(f"fp32 {name}: exit {code} in {took:.0f}s", file=sys.stderr, flush=True)
        code, took = run(args.runs_dir, f"bf16-{name}", [*flags, "--dtype", "bfloat16"], args.reuse)
        print(f"bf16 {name}: exit {code} in {took:.0f}s", file=sys.stderr, flush=True)
        rows.append({**row(args.runs_dir, fault, name), "seconds": round(took)})
        print(rows[-1], file=sys.stderr, flush=True)
    print(f"intervals {args.intervals}, concurrency {args.concurrency}, seed {args.seed}")
    cols = list(rows[0])
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
