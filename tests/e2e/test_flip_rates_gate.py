"""Flip rates end to end (reports/flip_rates.py): a bf16 fault whose every flip is one the per-turn oracle must call
numerics fails the gate on the excess of flips over the controls; the same clean run passes, its rate tests made.

No registered fault (engine/faults.py) is below the per-turn limits on the frozen suite in bf16: each moves the
turns it reaches past the restore window's, the envelope's or the drift tolerance's limits, and those turns are
flagged one by one (docs/reports.md, "Flip rates"). So this test injects, into the full candidate's servers only
(the path controls and the reference never get a fault), a fault that flips near-ties and moves no log-prob: the
verify step's greedy choice is made on logits rounded to a coarse grid (as a low-precision LM head on the verify
path would make it), ties going to the lowest token id. Each flip it makes is at a reference margin under the
grid's step, far inside the margin threshold and the path's reach, with no drift before it: soft. Only their number
tells them from numerics.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
GRID = 4  # logits rounded to quarters: every flip it makes is at a reference margin below 0.25

# Imported at start-up by every Python process of the run (sitecustomize on PYTHONPATH); acts only in a server that
# speculates with its radix cache on: the full candidate (`ctl-*-spec` runs with --disable-radix-cache).
HOOK = f'''
import sys

if "DFLASH" in sys.argv and "--disable-radix-cache" not in sys.argv:
    import importlib.abc
    import importlib.machinery

    class _RoundedVerify(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "engine.spec.dflash":
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                import torch

                exact = module.block_logits  # what the verify's greedy choice reads

                def block_logits(*args, **kwargs):
                    return torch.round(exact(*args, **kwargs) * {GRID}) / {GRID}

                module.block_logits = block_logits

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _RoundedVerify())
'''


def _run(runs: Path, run_id: str, hook: Path | None = None) -> tuple[int, Path]:
    cmd = [sys.executable, "-m", "harness.run", "--suite", "frozen", "--dtype", "bfloat16", "--intervals", "128",
           "--concurrency", "4", "--runs-dir", str(runs), "--run-id", run_id, "--no-progress", "--num-cpus", "4"]
    env = dict(os.environ)
    if hook is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hook), env.get("PYTHONPATH")]))
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500, env=env)
    print(proc.stdout[-3000:], proc.stderr[-3000:])
    return proc.returncode, runs / run_id


def _gated(run_dir: Path) -> pd.DataFrame:
    df = pd.read_csv(run_dir / "requests.csv")
    return df[~df["pool"].str.startswith("ctl-")]


def test_near_tie_flips_piling_up_fail_the_gate_and_a_clean_run_passes(tmp_path):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK)
    code, run_dir = _run(tmp_path, "faulty", hook)
    assert code == 1
    gated = _gated(run_dir)
    flips = gated[gated["first_divergence"].notna()]
    # one at a time, every flip is numerics: soft, at a reference margin under the grid's step, nothing drifts
    assert set(gated["class"]) <= {"exact", "soft"} and len(flips) >= 15
    assert flips["ref_margin"].max() < 1 / GRID
    summary = (run_dir / "summary.md").read_text()
    line = next(x for x in summary.splitlines() if x.startswith("- flips pile up: pool i128 at c4: "))
    assert "its turns against the controls of its path" in line and "of ctl-i128-spec + ctl-i128-cache" in line
    assert f"{len(flips)} of 74 (" in line and "one-sided exact p = " in line
    assert "**Diagnosis:** No single request was flagged, but flips pile up where numerics do not put them" in summary

    code, run_dir = _run(tmp_path, "clean")
    assert code == 0
    summary = (run_dir / "summary.md").read_text()
    assert "none found flips piling up; the smallest p-value is " in summary
    config = json.loads((run_dir / "config.json").read_text())
    assert config["calibration"]["per_pool"]["i128"]["flips_by_point"]["c4"][0] == 148  # both controls' turns
