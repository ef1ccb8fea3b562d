"""The analysis of a large run: `python -m reports.render` CPU time and peak RSS at 100k, 300k and 1M candidates.

    python benchmarks/render_scale.py SOURCE_RUN [--sizes 100000,300000,1000000] [--work /tmp/render-scale] [--keep]

SOURCE_RUN is a real, compacted run directory (e.g. `python -m harness.run --intervals 128 --concurrency 4
--dtype bfloat16 --calibrate` and `python -m records.compact RUN`); each size is made from it by
benchmarks/scale_replicate.py (its parts copied with every key, session and input renamed, so the references
grow with the candidates) and rendered in a child process. Per size it prints the candidates, the records'
bytes on disk, the render's CPU seconds (its rusage) and peak RSS (its own VmHWM), and the verdict line; the
last line prints the peak RSS per candidate between the two largest sizes (the slope the run grows at).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.scale import child, disk_bytes  # noqa: E402
from benchmarks.scale_replicate import replicate  # noqa: E402
from records.reader import RunReader  # noqa: E402


def candidates(run_dir: Path) -> int:
    reader = RunReader(run_dir)
    return sum(int((b.column("role").to_numpy(zero_copy_only=False) == "candidate").sum())
               for stem in reader.stems() for b in reader.batches(stem, ["role"], set()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", type=Path)
    p.add_argument("--sizes", default="100000,300000,1000000")
    p.add_argument("--work", type=Path, default=Path("/tmp/render-scale"))
    p.add_argument("--keep", action="store_true", help="keep each size's run directory")
    args = p.parse_args()
    per_copy = candidates(args.source)
    if not per_copy:
        raise SystemExit(f"{args.source}: no candidate records")
    rows = []
    print(f"source {args.source}: {per_copy} candidates", flush=True)
    print(f"{'candidates':>10} {'records MB':>10} {'render CPU s':>12} {'peak RSS MB':>11}  verdict", flush=True)
    for size in (int(s) for s in args.sizes.split(",")):
        run_dir = args.work / f"n{size}"
        factor = max(1, round(size / per_copy))
        if not (run_dir / "records").is_dir():
            replicate(args.source, factor, run_dir)
        cpu, hwm, out = child(["-m", "reports.render", str(run_dir)])
        verdict = next((line for line in out.splitlines() if line[:4] in ("PASS", "FAIL", "INCO")), "?")
        n = per_copy * factor
        rows.append((n, hwm))
        print(f"{n:>10} {disk_bytes(run_dir / 'records') / 1e6:>10.0f} {cpu:>12.1f} {hwm / 1e6:>11.0f}  {verdict}",
              flush=True)
        if not args.keep:
            shutil.rmtree(run_dir)
    if len(rows) > 1:
        (n0, m0), (n1, m1) = rows[-2], rows[-1]
        print(f"peak RSS grows {(m1 - m0) / (n1 - n0):.0f} bytes per candidate between {n0} and {n1}")


if __name__ == "__main__":
    main()
