"""Wall time of the full validation gate on this machine: what a user pays for one `python -m harness.run`.

Runs `python -m harness.run --suite load --num-requests N` (default N = 1,024: the documented full
validation, intervals 128/256 x concurrency 1/4/8/16) against the built-in engine with the trained
weights, then prints from its records (no assertions). The load suite's N requests are split between
the two interval pools by each session's interval, so a sweep point sends N candidate requests in
all and the run 4 x N (4,096 at N = 1,024):
  * wall time of the whole command (Ray and replica start-up included) and of the driver alone;
  * candidate requests/s;
  * the share of the driver's time during which at least one reference request was in flight,
    and the references' own request-seconds next to the candidates';
  * per sweep point: requests and seconds;
  * with N < 1,024, the full run extrapolated linearly from the driver's time (start-up added once).

    python benchmarks/gate_time.py [--num-requests 1024] [--keep] [-- extra harness.run flags]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from records.jsonl import load_run

FULL = 1024


def busy_seconds(spans: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) spans."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(spans):
        if e > end:
            total += e - max(s, end)
            end = e
    return total


def spans(records: list[dict]) -> list[tuple[float, float]]:
    """[t_start, t_start + e2e) of every answered record."""
    return [(r["t_start"], r["t_start"] + r["e2e"]) for r in records if r.get("e2e") is not None]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-requests", type=int, default=FULL, help="load-suite requests (per sweep point, all pools)")
    ap.add_argument("--runs-dir", default=None, help="keep the run here (default: a temporary directory)")
    ap.add_argument("harness_args", nargs="*", help="extra harness.run flags (after --)")
    args = ap.parse_args()
    runs = Path(args.runs_dir or tempfile.mkdtemp(prefix="gate-time-"))
    run_id = f"gate-{args.num_requests}-{int(time.time())}"
    cmd = [sys.executable, "-m", "harness.run", "--suite", "load", "--num-requests", str(args.num_requests),
           "--runs-dir", str(runs), "--run-id", run_id, "--no-progress", *args.harness_args]
    print("$ " + " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    rc = subprocess.call(cmd)
    wall = time.perf_counter() - t0
    run = load_run(runs / run_id)
    cands, refs = run.candidates, list(run.references.values())
    if not cands:
        sys.exit(f"no candidate records in {runs / run_id} (harness exit status {rc})")
    c_spans, r_spans = spans(cands), spans(refs)
    first = min(s for s, _ in c_spans + r_spans)
    last = max(e for _, e in c_spans + r_spans)
    driver = last - first
    startup = max(0.0, wall - driver)
    print(f"\nharness exit status {rc}; {len(cands)} candidate requests, {len(refs)} reference requests "
          f"(distinct inputs), {sum(r['error'] is not None for r in cands)} candidate errors")
    print(f"wall time: {wall:.1f}s for the command, {driver:.1f}s of requests (start-up and report {startup:.1f}s)")
    print(f"candidate requests/s: {len(cands) / wall:.2f} over the command, {len(cands) / driver:.2f} over the "
          "requests")
    ref_busy = busy_seconds(r_spans)
    c_sum, r_sum = sum(e - s for s, e in c_spans), sum(e - s for s, e in r_spans)
    print(f"references: in flight {100 * ref_busy / driver:.0f}% of the requests' time; request-seconds "
          f"{r_sum:.0f} reference vs {c_sum:.0f} candidate ({100 * r_sum / max(1e-9, r_sum + c_sum):.0f}% reference)")
    points: dict[tuple[str, int], tuple[float, float]] = {}  # one stats record per replica: merge them
    for st in run.stats:
        k = (st["pool"], st["concurrency"])
        s0, e0 = points.get(k, (st["t_start"], st["t_end"]))
        points[k] = (min(s0, st["t_start"]), max(e0, st["t_end"]))
    for (pool, conc), (s0, e0) in sorted(points.items()):
        n = sum(1 for c in cands if c["pool"] == pool and c["concurrency"] == conc)
        print(f"  {pool} c={conc}: {n} requests in {e0 - s0:.1f}s")
    if args.num_requests < FULL:
        scale = FULL / args.num_requests
        print(f"extrapolated full validation (--num-requests {FULL}, linear in the requests' time): "
              f"{(startup + driver * scale) / 60:.1f} min (measured at 1/{scale:g} scale)")


if __name__ == "__main__":
    main()
