"""Chaos (issue 18): the frozen suite while replicas are SIGKILLed at random (a bounded number of times) ends
with complete, duplicate-free records whose outputs equal an uninterrupted run's. benchmarks/chaos.py does the
work and prints the figures; this runs it small (tiny random model, one interval, concurrency 1 and 4)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from workloads.frozen import generate_frozen

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_random_replica_kills_leave_the_records_equal_to_an_uninterrupted_run(tmp_path):
    proc = subprocess.run([sys.executable, "benchmarks/chaos.py", "--kills", "3", "--seed", "7", "--gap", "4",
                           "--runs-dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=850)
    out = proc.stdout + proc.stderr
    print(out[-4000:])
    assert proc.returncode == 0, out[-4000:]
    assert "OK: complete, duplicate-free, outputs equal the uninterrupted run's" in out
    figures = dict(m.groups() for m in re.finditer(r"^  (\w+): (.*)$", proc.stdout, re.M))
    assert figures["duplicates"] == "0" and figures["errors"] == "[]" and figures["outputs_differ"] == "[]"
    # every turn of the frozen suite's I = 128 sessions at concurrency 1 and 4, and its reference served once
    turns = sum(len(s.turns) for s in generate_frozen((128,)))
    assert figures["records_clean"] == figures["records_chaos"] == str(3 * turns)
    assert "kill(s)" in out and ", 0 kill(s)" not in out  # the monkey did kill something


@pytest.mark.timeout(2400)
def test_a_killed_node_and_signals_at_three_phases_then_resume_equal_an_uninterrupted_run(tmp_path):
    """Issue 27: the worker node of a two-node cluster killed mid-run; SIGINT and SIGTERM at probe, drive and
    render, each followed by --resume: the records (counted raw, duplicates kept) and the verdict are the
    uninterrupted run's, and nothing of a run serves after its harness exited."""
    proc = subprocess.run([sys.executable, "benchmarks/chaos.py", "--scenarios", "node,signals", "--sessions", "3",
                           "--runs-dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=2300)
    out = proc.stdout + proc.stderr
    print(out[-6000:])
    assert proc.returncode == 0, out[-6000:]
    scenarios = re.findall(r"^scenario (\S+): (.*)$", proc.stdout, re.M)
    assert [name for name, _ in scenarios] == ["node", "sigint-probe", "sigint-drive", "sigint-render",
                                               "sigterm-probe", "sigterm-drive", "sigterm-render"]
    assert all("(same as the clean run); left serving after exit: []" in line for _, line in scenarios)
    assert all(f == "0" for f in re.findall(r"^  duplicates: (.*)$", proc.stdout, re.M))
