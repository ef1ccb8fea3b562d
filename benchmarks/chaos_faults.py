"""The node and signal scenarios of benchmarks/chaos.py: a worker node killed under a run on a two-node local
cluster, and SIGINT / SIGTERM at three phases of a run, each finished with `--resume`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from chaos_run import ROOT, harness_command, headline, records, replica_servers, run_harness

PHASES = ("probe", "drive", "render")
EXPECTED = {signal.SIGINT: 130, signal.SIGTERM: 143}  # docs/harness.md, exit statuses


def left_serving(run_id: str, grace: float = 15.0) -> list[int]:
    """Servers of `run_id` still running `grace` seconds after its harness exited (there should be none)."""
    deadline = time.monotonic() + grace
    while (pids := replica_servers(run_id)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return pids


def _recorded(run_dir: Path) -> bool:
    try:
        return any(r["role"] == "candidate" for r in records(run_dir))
    except (OSError, ValueError, KeyError):
        return False  # not there yet, or a line half written


def node_scenario(runs_dir: Path, run_id: str, args: list[str]) -> dict:
    """The run on a head (3 CPUs) + worker (2 CPUs) cluster; the worker node is killed (SIGKILL, no graceful
    shutdown) once the run has recorded something. Ray restarts its replicas on the head."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 3, "include_dashboard": False})
    try:
        worker = cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        killed: list[float] = []

        def kill_worker() -> None:
            t0 = time.monotonic()
            while not _recorded(runs_dir / run_id):
                if time.monotonic() - t0 > 600:
                    return
                time.sleep(0.2)
            cluster.remove_node(worker, allow_graceful=False)
            killed.append(round(time.monotonic() - t0, 1))

        killer = threading.Thread(target=kill_worker, daemon=True)
        killer.start()
        rc, took, _, out = run_harness(runs_dir, run_id, [*args, "--address", cluster.address])
        killer.join(timeout=1)
        return {"name": "node", "run_id": run_id, "exit": rc, "verdict": headline(out), "left": left_serving(run_id),
                "what": f"worker node killed at {killed[0] if killed else 'never (run ended first)'} s, run took "
                        f"{took:.1f}s"}
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()


def _wait_phase(proc: subprocess.Popen, lines: list[str], run_dir: Path, phase: str, third: int) -> bool:
    """Block until the run reaches `phase` (False if it exited first)."""
    while proc.poll() is None:
        text = "\n".join(lines)
        if phase == "probe" and "replicas listen on" in text:
            return True
        if phase == "render" and "\ncandidates: " in "\n" + text:
            return True
        if phase == "drive":
            try:
                if sum(r["role"] == "candidate" for r in records(run_dir)) >= third:
                    return True
            except (OSError, ValueError, KeyError):
                pass  # not there yet, or a line half written
        time.sleep(0.05)
    return False


def interrupted_run(runs_dir: Path, run_id: str, args: list[str], sig: int, phase: str, third: int) -> dict:
    """Start a run, send `sig` at `phase`, then `--resume` it; the figures of both runs."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")  # the phase is read from its output as it comes
    # as from a terminal: a shell starts background jobs with SIGINT ignored, which Python (and so the harness)
    # keeps; Ctrl-C reaches a foreground harness with the default disposition
    proc = subprocess.Popen(harness_command(runs_dir, run_id, args), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    landed = _wait_phase(proc, lines, runs_dir / run_id, phase, third) and "\nreport: " not in "\n" + "".join(lines)
    if landed:  # (else the run printed its report first: it is over)
        proc.send_signal(sig)
    rc = proc.wait(timeout=600)
    reader.join(timeout=10)
    stopped = "\n".join(lines)
    hint = f"--resume {runs_dir / run_id}" in stopped
    left_stopped = left_serving(run_id)
    resume = [sys.executable, "-m", "harness.run", *args, "--resume", str(runs_dir / run_id), "--no-progress"]
    done = subprocess.run(resume, cwd=ROOT, capture_output=True, text=True, timeout=900)
    out = done.stdout + done.stderr
    print(f"--- {run_id}: {signal.Signals(sig).name} at {phase}: exit {rc} (expected {EXPECTED[sig]}), resume hint "
          f"{'shown' if hint else 'MISSING'}; resume exit {done.returncode}\n" + "\n".join(out.splitlines()[-8:]))
    what = (f"{signal.Signals(sig).name} at {phase}: " + (f"exit {rc}" if landed else f"run ended first (exit {rc})")
            + (", resume hint shown" if hint else ", NO resume hint") + f", resume exit {done.returncode}")
    bad_stop = landed and (rc != EXPECTED[sig] or not hint or "Traceback" in stopped)
    return {"name": f"{signal.Signals(sig).name.lower()}-{phase}", "run_id": run_id, "what": what,
            "exit": done.returncode if not bad_stop else f"bad stop {rc}", "verdict": headline(out),
            "left": left_stopped + left_serving(run_id)}


SIGNAL_SCENARIOS = [f"{s}-{p}" for s in ("sigint", "sigterm") for p in PHASES]


def signal_scenarios(runs_dir: Path, tag: str, args: list[str], names: list[str] = SIGNAL_SCENARIOS) -> list[dict]:
    """The signal scenarios `names` (sigint-probe, ..., sigterm-render), each followed by `--resume`."""
    clean = sum(r["role"] == "candidate" for r in records(runs_dir / f"clean-{tag}"))
    sigs = {"sigint": signal.SIGINT, "sigterm": signal.SIGTERM}
    return [interrupted_run(runs_dir, f"{name}-{tag}", args, sigs[name.split("-")[0]], name.split("-")[1],
                            max(1, clean // 3)) for name in names]
