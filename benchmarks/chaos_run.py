"""Running `python -m harness.run` for benchmarks/chaos.py and its scenarios (benchmarks/chaos_faults.py), and
reading what a run left: its records, its verdict line, the replica servers still serving."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from records.reader import raw_records  # noqa: E402


def replica_servers(run_id: str) -> list[int]:
    """Pids of the engine.serve processes of run `run_id` (their stdout is a log in /tmp/specgate/RUN_ID/)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ours = f"/specgate/{run_id}/" in os.readlink(d / "fd" / "1")
            if ours and b"engine.serve" in (d / "cmdline").read_bytes():
                pids.append(int(d.name))
        except OSError:
            continue
    return sorted(pids)


def records(run_dir: Path) -> list[dict]:
    """Every stored candidate and reference record, journals and parts (duplicates kept, to be counted); stats,
    sweep-point and warmup records are not gated requests."""
    return [r for r in raw_records(run_dir) if r.get("role") in ("candidate", "reference")]


class Monkey(threading.Thread):
    """Kills up to `kills` replica servers of `run_id`, at random moments at least `gap` seconds apart."""

    def __init__(self, run_id: str, run_dir: Path, kills: int, seed: int, gap: float) -> None:
        super().__init__(daemon=True)
        self.run_id, self.run_dir, self.kills, self.gap = run_id, run_dir, kills, gap
        self.rng = random.Random(seed)
        self.done = threading.Event()
        self.killed: list[tuple[float, int]] = []

    def run(self) -> None:
        t0 = time.monotonic()
        while len(self.killed) < self.kills and not self.done.wait(self.gap * (0.5 + self.rng.random())):
            if not list((self.run_dir / "records").glob("candidate-*.jsonl")) + \
                    list((self.run_dir / "records").glob("part-*/candidate-*.parquet")):
                continue  # nothing recorded yet: replicas may still be starting
            pids = replica_servers(self.run_id)
            if not pids:
                continue
            pid = self.rng.choice(pids)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.killed.append((round(time.monotonic() - t0, 1), pid))


def harness_command(runs_dir: Path, run_id: str, args: list[str]) -> list[str]:
    """`python -m harness.run` into `runs_dir/run_id`."""
    return [sys.executable, "-m", "harness.run", *args, "--runs-dir", str(runs_dir), "--run-id", run_id,
            "--no-progress"]


def run_harness(runs_dir: Path, run_id: str, args: list[str], kills: int = 0, seed: int = 0,
                gap: float = 8.0) -> tuple[int, float, list, str]:
    """One `python -m harness.run`; with `kills`, a Monkey runs beside it. Returns (exit, seconds, kills, output)."""
    monkey = Monkey(run_id, runs_dir / run_id, kills, seed, gap) if kills else None
    t0 = time.monotonic()
    proc = subprocess.Popen(harness_command(runs_dir, run_id, args), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    if monkey:
        monkey.start()
    out, _ = proc.communicate()
    if monkey:
        monkey.done.set()
        monkey.join()
    took = time.monotonic() - t0
    print(f"--- {run_id}: exit {proc.returncode} in {took:.1f}s\n" + "\n".join(out.splitlines()[-12:]))
    return proc.returncode, took, monkey.killed if monkey else [], out


def headline(output: str) -> str | None:
    """The verdict line a run printed (PASS / FAIL / INCONCLUSIVE: ...), None if it printed none."""
    lines = [ln for ln in output.splitlines() if ln.split(":")[0] in ("PASS", "FAIL", "INCONCLUSIVE")]
    return lines[-1] if lines else None


def gated(line: str | None) -> str | None:
    """A headline without its soft count ("..., 2 soft (1.4%)"), which a tie flip moves."""
    return re.sub(r", \d+ soft \([\d.]+%\)", "", line) if line else line
