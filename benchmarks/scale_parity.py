"""Same report before and after (issue 29): a run directory rendered by earlier code and by this one.

    git archive 6e26297 | (mkdir -p /tmp/before && tar -x -C /tmp/before)
    python benchmarks/scale_parity.py RUN_DIR --before /tmp/before [--work /tmp/parity]

Makes three copies of RUN_DIR under --work: `before` (its records as journals, rendered by the code in
--before with `python -m reports.render`), `after` (its records compacted into parts, rendered by this code:
the streamed render, reports/analyze_run.py), `journals` (the journals again, rendered by this code: an old
run directory). Prints the verdicts and, per output file, whether it is byte-identical to `before`'s; exits 1
if any differs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OUTPUTS = ["requests.csv", "boundaries.csv", "configs.csv", "coverage.csv", "tree_shapes.csv", "summary.md",
           "junit.xml", "report.html"]


def _copy(run_dir: Path, out: Path) -> None:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    shutil.copy(run_dir / "config.json", out / "config.json")
    shutil.copytree(run_dir / "records", out / "records")


def _render(run_dir: Path, code: Path | None) -> str:
    env = {**os.environ, "PYTHONPATH": str(code)} if code else None
    p = subprocess.run([sys.executable, "-m", "reports.render", str(run_dir)], cwd=code or ROOT, env=env,
                       capture_output=True, text=True)
    if p.returncode not in (0, 1):
        raise SystemExit(f"render of {run_dir} exited {p.returncode}: {p.stderr[-2000:]}")
    return p.stdout.splitlines()[0]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--before", type=Path, required=True, help="a source tree of the earlier code")
    p.add_argument("--work", type=Path, default=Path("/tmp/parity"))
    args = p.parse_args()
    from benchmarks.scale_children import jsonl_copy
    from records.compact import compact_run

    before, after, journals = (args.work / n for n in ("before", "after", "journals"))
    jsonl_copy(args.run_dir, before)
    jsonl_copy(args.run_dir, journals)
    _copy(args.run_dir, after)
    compact_run(after)
    print(f"before:   {_render(before, args.before.resolve())}\nafter:    {_render(after, None)}\n"
          f"journals: {_render(journals, None)}")
    bad = 0
    for name in OUTPUTS:
        if not (before / name).exists():
            print(f"{name}: not written by the earlier code")
            continue
        for label, d in (("after", after), ("journals", journals)):
            if (d / name).exists():
                same = (d / name).read_bytes() == (before / name).read_bytes()
                bad += not same
                print(f"{name}: {label} {'identical' if same else 'DIFFERS'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
