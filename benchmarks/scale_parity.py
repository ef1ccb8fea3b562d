"""Same report before and after (issue 29): a run directory rendered by earlier code and by this one.

    git archive 6e26297 | (mkdir -p /tmp/before && tar -x -C /tmp/before)
    python benchmarks/scale_parity.py RUN_DIR --before /tmp/before [--work /tmp/parity] [--calibrate]

Makes three copies of RUN_DIR under --work: `before` (its records as journals, rendered by the code in
--before with `python -m reports.render`), `after` (its records compacted into parts, rendered by this code:
the streamed render, reports/analyze_run.py), `journals` (the journals again, rendered by this code: an old
run directory). Prints the verdicts and, per output file, whether it is byte-identical to `before`'s; exits 1
if any differs.

`--calibrate` (a calibrated run: bf16, vLLM): each copy is calibrated first (harness.calibrate.calibrated_gate from
the thresholds its config.json holds, then render_run with the per-pool thresholds, as `harness.run` renders),
`before` from parts too (a run is compacted before it is rendered), and config.json's `calibration` and `gate`
are compared as well.
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


CALIBRATE = """import sys
from pathlib import Path
from harness.calibrate import calibrated_gate
from records.rundir import load_config
from reports.gate import GateThresholds
from reports.render import render_run
d = Path(sys.argv[1])
gate, per_pool = calibrated_gate(d, GateThresholds.from_config(load_config(d)), False)
print(render_run(d, gate, per_pool).headline)
"""


def _render(run_dir: Path, code: Path | None, calibrate: bool = False) -> str:
    env = {**os.environ, "PYTHONPATH": str(code)} if code else None
    how = ["-c", CALIBRATE] if calibrate else ["-m", "reports.render"]
    p = subprocess.run([sys.executable, *how, str(run_dir)], cwd=code or ROOT, env=env,
                       capture_output=True, text=True)
    if p.returncode not in (0, 1):
        raise SystemExit(f"render of {run_dir} exited {p.returncode}: {p.stderr[-2000:]}")
    return p.stdout.splitlines()[0]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--before", type=Path, required=True, help="a source tree of the earlier code")
    p.add_argument("--work", type=Path, default=Path("/tmp/parity"))
    p.add_argument("--calibrate", action="store_true", help="calibrate each copy first (a calibrated run)")
    args = p.parse_args()
    from benchmarks.scale_children import jsonl_copy
    from records.compact import compact_run

    before, after, journals = (args.work / n for n in ("before", "after", "journals"))
    if args.calibrate:
        _copy(args.run_dir, before)
        compact_run(before)
    else:
        jsonl_copy(args.run_dir, before)
    jsonl_copy(args.run_dir, journals)
    _copy(args.run_dir, after)
    compact_run(after)
    cal = args.calibrate
    print(f"before:   {_render(before, args.before.resolve(), cal)}\nafter:    {_render(after, None, cal)}\n"
          f"journals: {_render(journals, None, cal)}")
    bad = 0
    if cal:
        import json

        def calibration(d: Path) -> dict:
            config = json.loads((d / "config.json").read_text())
            return {k: config.get(k) for k in ("calibration", "gate")}

        for label, d in (("after", after), ("journals", journals)):
            same = calibration(d) == calibration(before)
            bad += not same
            print(f"config.json calibration and gate: {label} {'identical' if same else 'DIFFERS'}")
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
