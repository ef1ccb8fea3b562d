"""Each registered fault in bf16 against the turns it affects: the figures of docs/reports.md's fault table.

For every fault it runs the same command twice, in fp32 (the exact target) and in bf16 (calibrated against the
controls), plus clean bf16 runs, and prints per fault: the bf16 verdict; the affected turns and how many the bf16
gate flagged; the resolvable ones among them and how many were flagged; what it flagged outside them (and how
many of those restored another checkpoint than in the fp32 run: batch timing); how many were flagged by their
restore window (reports/window.py); how many only by the paired check (a run with --baseline-run: the turns a
run without a trusted run would not flag); the affected turns flagged per sweep point; and the flip-rate tests
(reports/flip_rates.py) of the bf16 run, re-judged with the current gate: the smallest p-value of its family, the
level each test is held to, the tests that found flips piling up, and whether they alone decide the verdict (the
run would have passed without them). With --no-fp32 only the bf16 runs are made (the resolvable column then counts
every affected turn).

The affected turns of a run are the ones its engine reports the fault reached (`injected_fault_hit`: they resumed
from, or computed, a state the fault corrupted, or read KV pages such a step wrote; docs/engine.md), so each dtype's
run is measured on its own turns: concurrency makes batches, and so evictions, restores and draft acceptance, differ
between the fp32 and the bf16 run of the same command. (Runs made before the engine reported it fall back to the
turns the exact fp32 oracle flags in the fp32 run, and, for a fault that depends on batch timing, to the bf16 run's
turns that restored a verify crossing its engine did not copy.) The fp32 columns check the marks against the exact
oracle. An affected turn is resolvable when the fault's own effect on it (its drift in the fp32 run, where numerics
move log-probs by ~1e-5) exceeds what bf16 numerics alone moved in the clean runs (their largest window and output
drift): below that no oracle against the cold path can tell the fault from numerics, only a deterministic twin
(--baseline-run at concurrency 1, reports/paired.py). A turn the fault reached in the bf16 run but not in the fp32
one has no measured effect and counts as resolvable.
Runs already in RUNS_DIR are reused with --reuse. A run that leaves no records (refused, or stopped: finish it with
`harness.run --resume`) is named, left out of the table, and the script exits 1.

    python benchmarks/fault_matrix.py [--intervals 128] [--concurrency 4] [--seed 0] [--clean-seeds 0,1,2]
                                      [--faults a,b] [--runs-dir runs/fault-matrix] [--reuse] [--no-fp32]
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
from reports.paired import DETAIL as PAIRED  # noqa: E402
from reports.render import render_run  # noqa: E402

TIMING_FAULTS = {TRACK_DROPPED_ON_BATCH_CHANGE}
# a fault that only acts under cache pressure runs with a state pool small enough to evict
FAULT_ARGS = {EVICT_MATCHED_CHECKPOINT: ["--candidate-args", "--max-state-slots 16"]}
FLAGGED = ("drift", "hard")


def run(runs: Path, run_id: str, args: list[str], reuse: bool) -> tuple[int | None, float]:
    """harness.run into runs/run_id (its exit status and seconds; None, 0 when reused)."""
    if reuse and finished(runs / run_id):
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


def finished(run_dir: Path) -> bool:
    return (run_dir / "requests.csv").exists()


def headline(run_dir: Path) -> str:
    """The verdict line of the run's summary; what is missing when the run wrote none (it was refused or stopped)."""
    summary = run_dir / "summary.md"
    if not summary.exists():
        return f"no verdict: {run_dir} has no summary.md (see the harness output above)"
    lines = summary.read_text().splitlines()
    return lines[2].strip("*") if len(lines) > 2 else "?"


def rate_figures(run_dir: Path) -> dict:
    """The run re-judged with the flip-rate tests (reports/flip_rates.py): the smallest p-value of its family and
    that test, the family's per-test level, the tests that found flips piling up, and whether they alone decide a
    FAIL (without them it would have passed, or been INCONCLUSIVE)."""
    verdict = render_run(run_dir)
    tests = verdict.rate_tests
    first = min(tests, key=lambda t: t.test.p) if tests else None
    return {"rates: smallest p": f"{first.test.p:.2g} ({first.pool}{' ' + first.point if first.point else ''} "
                                 f"{first.kind} {first.event}: {first.test.events_a}/{first.test.turns_a} vs "
                                 f"{first.test.events_b}/{first.test.turns_b})" if first else "",
            "rates: level": f"0.001/{first.family}" if first else "",
            "rates: found": "; ".join(f"{t.pool}{' ' + t.point if t.point else ''} {t.kind} {t.event} p={t.test.p:.2g}"
                                      for t in verdict.rate_findings),
            "rates decide": "yes" if verdict.decided_by_rates else ""}


def hits(df: pd.DataFrame) -> set[str] | None:
    """The turns the run's engine reports the fault reached; None when its records do not say."""
    if "injected_fault_hit" not in df or df["injected_fault_hit"].isna().all():
        return None
    return set(df.loc[df["injected_fault_hit"].fillna(False).astype(bool), "key"])


def affected(fault: str | None, fp32: pd.DataFrame, bf16: pd.DataFrame) -> set[str]:
    if fault is None:
        return set()
    own = hits(bf16)
    if own is not None:
        return own
    if fault in TIMING_FAULTS:
        own = bf16[bf16["restored_verify_crossed"].fillna(False).astype(bool)
                   & ~bf16["restored_crossing_tracked"].fillna(True).astype(bool)]
        return set(own["key"])
    return set(fp32.loc[fp32["class"].isin(FLAGGED), "key"])


def noise(runs: Path, clean: list[str]) -> tuple[float, float]:
    """The largest window and output drift bf16 numerics alone made in the clean runs' gated turns: what a fault's
    effect must exceed to be told from numerics without a deterministic twin."""
    dfs = [gated(runs / f"bf16-{name}") for name in clean]
    window = max((float(df["window_drift"].max()) for df in dfs if "window_drift" in df), default=0.0)
    output = max(float(df["drift"].max()) for df in dfs)
    return window, output


def row(runs: Path, fault: str | None, name: str, floor: tuple[float, float]) -> dict:
    """One fault's figures (module doc). `floor`: noise(); an affected turn whose own effect (its fp32 drift, of
    its window or its outputs: fp32 numerics move them by ~1e-5) stays within it is below bf16's resolution."""
    bf16_dir = runs / f"bf16-{name}"
    rates = rate_figures(bf16_dir)  # first: it re-renders the run with the current gate
    bf16 = gated(bf16_dir)
    fp32_dir = runs / f"fp32-{name}"
    fp32 = gated(fp32_dir) if fault and (fp32_dir / "requests.csv").exists() else bf16.iloc[:0]
    hit = affected(fault, fp32, bf16)
    flagged = set(bf16.loc[bf16["class"].isin(FLAGGED), "key"])
    window = set(bf16.loc[bf16["window_status"].eq("flagged") & bf16["class"].isin(FLAGGED), "key"]) \
        if "window_status" in bf16 else set()
    fp32_hit = hits(fp32) if len(fp32) else None
    fp32_flagged = set(fp32.loc[fp32["class"].isin(FLAGGED), "key"]) if len(fp32) else set()
    if (fault in TIMING_FAULTS and hits(bf16) is None) or not len(fp32):
        resolvable = hit
    else:
        f = fp32.set_index("key")
        effect = f["window_drift"].fillna(0.0).clip(lower=0) if "window_drift" in f else 0.0
        big = set(f[(effect > floor[0]) | (f["drift"].fillna(0.0) > floor[1])].index)
        measured = fp32_hit if fp32_hit is not None else fp32_flagged  # turns whose fp32 effect is the fault's
        resolvable = hit & (big | (hit - measured))
    # a turn flagged outside the fp32 run's set that restored another checkpoint there (batch timing) is not
    # comparable with it
    cached = fp32.set_index("key")["cached_tokens"] if len(fp32) else pd.Series(dtype=float)
    outside = flagged - hit
    other_restore = {k for k in outside if k in cached.index
                     and cached[k] != bf16.set_index("key").loc[k, "cached_tokens"]}

    def share(a: set, b: set) -> str:
        return f"{len(a)}/{len(b)} ({len(a) / len(b):.0%})" if b else ""

    # flagged only by the paired check (their class moved to drift because their trusted twin differs): the
    # turns a run without a trusted run (--baseline-run) would not flag
    paired = set(bf16.loc[bf16["detail"].fillna("").astype(str).str.startswith(PAIRED), "key"]) & flagged

    fp32_check = {"fp32: affected flagged": "", "fp32: outside": ""}
    if fp32_hit is not None:  # the marks against the exact oracle: it flags the marked turns and nothing else
        fp32_check = {"fp32: affected flagged": share(fp32_flagged & fp32_hit, fp32_hit),
                      "fp32: outside": len(fp32_flagged - fp32_hit)}
    return {"fault": name, "verdict": headline(bf16_dir), **fp32_check, "affected flagged": share(flagged & hit, hit),
            "resolvable flagged": share(flagged & resolvable, resolvable),
            "outside": len(outside), "outside, restored otherwise than in fp32": len(other_restore),
            "by the window": len(window & hit), "by the paired check only": len(paired & hit),
            "per sweep point": per_point(bf16, flagged, hit), **rates}


def per_point(df: pd.DataFrame, flagged: set[str], hit: set[str]) -> str:
    """Affected turns flagged / affected, and flagged outside them where any, per pool and concurrency (only
    when the run has more than one sweep point)."""
    points = df.groupby(["pool", "concurrency"])["key"].agg(set)
    if len(points) < 2:
        return ""
    cells = []
    for (pool, conc), keys in points.items():
        reached, outside = keys & hit, (keys & flagged) - hit
        cells.append(f"{pool} c{conc} {len(reached & flagged)}/{len(reached)}" + (f" +{len(outside)}" if outside
                                                                                 else ""))
    return ", ".join(cells)


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
    parser.add_argument("--no-fp32", action="store_true", help="bf16 runs only (no fp32 twin: the resolvable "
                        "column then counts every affected turn)")
    parser.add_argument("extra", nargs="*", help="more harness.run flags (after --)")
    args = parser.parse_args(argv)
    faults = list(FAULTS) if args.faults == "all" else args.faults.split(",")
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        parser.error(f"unknown fault(s) {', '.join(unknown)}; registered: {', '.join(FAULTS)}")
    base = ["--intervals", args.intervals, "--concurrency", args.concurrency, *args.extra]
    args.runs_dir.mkdir(parents=True, exist_ok=True)
    rows, done, missing = [], [], []
    seeds = [int(x) for x in (args.clean_seeds or str(args.seed)).split(",")]
    clean = ["clean" if seeds == [args.seed] else f"clean-s{seed}" for seed in seeds]
    for fault, seed in [(None, s) for s in seeds] + [(f, args.seed) for f in faults]:
        name = fault or clean[seeds.index(seed)]
        fault_args = ["--inject-fault", fault, *FAULT_ARGS.get(fault, [])] if fault else []
        flags = [*base, "--seed", str(seed), *fault_args]
        if fault and not args.no_fp32:
            code, took = run(args.runs_dir, f"fp32-{name}", flags, args.reuse)
            print(f"fp32 {name}: exit {code} in {took:.0f}s", file=sys.stderr, flush=True)
        code, took = run(args.runs_dir, f"bf16-{name}", [*flags, "--dtype", "bfloat16"], args.reuse)
        print(f"bf16 {name}: exit {code} in {took:.0f}s: {headline(args.runs_dir / f'bf16-{name}')}",
              file=sys.stderr, flush=True)
        twins = [f"bf16-{name}"] + ([f"fp32-{name}"] if fault and not args.no_fp32 else [])
        missing += [t for t in twins if not finished(args.runs_dir / t)]
        if finished(args.runs_dir / f"bf16-{name}"):
            done.append((fault, name))
    if missing:  # a run refused or stopped (its run directory can be finished with harness.run --resume)
        print(f"no figures for {', '.join(missing)}: left out of the table", file=sys.stderr)
    if any(not finished(args.runs_dir / f"bf16-{name}") for name in clean):
        print("no clean run to measure bf16 noise against: no table", file=sys.stderr)
        return 1
    floor = noise(args.runs_dir, clean)
    for fault, name in done:
        rows.append(row(args.runs_dir, fault, name, floor))
    print(f"intervals {args.intervals}, concurrency {args.concurrency}, seed {args.seed}; bf16 clean noise: window "
          f"drift up to {floor[0]:.3g}, output drift up to {floor[1]:.3g}")
    cols = list(rows[0])
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
