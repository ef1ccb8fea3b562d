"""`python -m harness.run`: start pools, drive the workload, write records, report and gate.

Exit status: 0 the gate passed, 1 the gate failed, 2 the harness itself failed
(bad config, no cluster, a replica or endpoint unusable, no records, the run directory
in use by another process), 3 inconclusive (reports/gate.py), 130 interrupted (SIGINT)
and 143 terminated (SIGTERM): finish the run with `--resume RUN_DIR`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import traceback
from dataclasses import asdict, replace
from pathlib import Path

import aiohttp

from harness.backends import RequestError
from harness.backends.metrics import counter_report, snapshot, with_earlier_parts
from harness.cli import from_argv
from harness.config import ConfigError, RunConfig
from harness.driver_actors import make_driver, resolve_drivers
from harness.errors import HarnessError
from harness.plan import Plan
from harness.pools import Pool
from harness.progress import Progress
from harness.resume import for_resume, trusted_lines
from harness.run_config_file import write_config
from harness.targets import Target, make_target
from harness.workload import describe as describe_workload
from records.driver_parts import adopt
from records.incidents import IncidentLog, load_incidents
from records.jsonl import RecordFiles
from records.lock import RunLock, RunLocked
from records.resume import ResumeState
from records.rundir import create_run_dir, discard_if_empty, load_config, new_run_id, update_latest, write_json
from reports.gate import EXIT_HARNESS_FAILED, EXIT_PASS
from reports.incidents import incident_lines
from reports.render import render_run

EXIT_INTERRUPTED = 130  # SIGINT (Ctrl-C); the run can be finished with --resume
EXIT_TERMINATED = 143  # SIGTERM (128 + 15, the shell's convention); finished with --resume too
HEARTBEAT_S = 30.0  # without a live bar, a line of the counters this often: a CI log must not look hung


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so that it unwinds as Ctrl-C does: pools stopped, records kept."""


def make_plan(target: Target, sessions: list | None = None, probe: bool = True) -> tuple[Plan, dict[str, dict]]:
    """The run plan and the server infos learned before anything is written (already-running servers are probed
    now; with `probe`, one short request each), the sessions built for what the target runs (`sessions`: given
    by a test); ConfigError / HarnessError."""
    infos = target.probe(generate=probe)
    workload = target.workload(infos)
    sessions, left_out = target.sessions(workload) if sessions is None else (sessions, 0)
    plan = target.plan(sessions, infos)
    return replace(plan, workload=describe_workload(target.cfg, workload, left_out), tokenizer=workload.tokenizer), \
        infos


async def drive(cfg: RunConfig, target: Target, plan: Plan, cands: list[Pool], ref: Pool, run_dir: Path,
                run_id: str, resumed: bool, infos: dict[str, dict]) -> Progress:
    """Read each replica's /server_info (stopping where it contradicts its pool), write config.json, run the driver;
    return the final counters."""
    if adopt(run_dir):  # what driver actors of an earlier process wrote (records/driver_parts.py)
        print(f"joined the records of earlier driver actors into {run_dir / 'records'}")
    state = ResumeState.read(run_dir)  # keys and summaries, not records (records/resume.py)
    existing, existing_refs = state.candidates, state.references
    tokenizer = plan.tokenizer.name if plan.tokenizer is not None else "unknown"
    incidents = IncidentLog(run_dir)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        for pool in (*cands, ref):
            pool.incidents = incidents
        await target.check_servers(http, (*cands, ref), infos)
        write_config(run_dir, cfg, target, run_id, plan, [*cands, ref], resumed, type(ref.backend).window_unprobed)
        sessions = {p.name: p.sessions for p in plan.candidates}
        recorded = sum(1 for k in existing if any(k.startswith(p.name + "-c") for p in plan.candidates))
        live = not cfg.no_progress and sys.stderr.isatty()
        progress = Progress(plan.total_candidate_requests, recorded, enabled=live, heartbeat=HEARTBEAT_S)
        files = RecordFiles(run_dir, set(existing) | {f"ref/{h}" for h in existing_refs})
        drivers = resolve_drivers(cfg, sessions)
        driver = make_driver(
            drivers, run_dir, run_id=run_id, concurrency=cfg.concurrency, candidates=cands, reference=ref,
            files=files, http=http, progress=progress, existing=existing, existing_refs=existing_refs,
            turn_io=state.io, request_timeout=cfg.request_timeout, max_retries=cfg.max_retries,
            reference_concurrency=cfg.reference_concurrency, sequential_pools=cfg.sequential_pools,
            api_key=cfg.api_key, tokenizers={p.name: tokenizer for p in (*cands, ref)},
            decode=plan.tokenizer.decode if plan.tokenizer is not None else None,
            request_rate=cfg.request_rate, arrival=cfg.arrival, seed=cfg.seed, warmup=cfg.warmup,
            duration=cfg.duration, max_error_rate=cfg.max_error_rate, windows=not cfg.no_restore_window)
        before = await snapshot(http, [*cands, ref])
        try:
            await driver.run(sessions)
            counted = counter_report(before, await snapshot(http, [*cands, ref]))
            write_json(run_dir / "server_counters.json", with_earlier_parts(counted, _earlier_counters(run_dir)))
        finally:
            await driver.close()
            files.close()
            progress.close()
    return progress


def _earlier_counters(run_dir: Path) -> dict | None:
    """server_counters.json of the run's earlier parts (a --resume), None where there is none or it is unreadable."""
    try:
        return json.loads((run_dir / "server_counters.json").read_text())
    except (OSError, ValueError):
        return None


def render(run_dir: Path, cfg: RunConfig) -> int:
    """Tables, plots, report and the gate's verdict; a calibrated run (harness/calibrate.py: --calibrate,
    --baseline-run, a noisy target) gates each pool with thresholds from the controls sharing its code path.
    Returns the exit status (0 pass, 1 fail, 2 harness failed, 3 inconclusive)."""
    try:
        from harness.calibrate import calibrated_gate, calibrating

        gate, per_pool = replace(cfg.gate, min_coverage=cfg.min_coverage), None
        cluster = (cfg.address or "local") if cfg.analyze_on_cluster else None  # the Ray cluster to analyze on
        if calibrating(cfg):
            gate, per_pool = calibrated_gate(run_dir, gate, cfg.drift_tolerance is not None, cfg.baseline_run, cluster)
            print(f"calibration: {load_config(run_dir)['calibration']['text']}")
        else:  # --min-coverage is the run's; `python -m reports.render` re-reads it from here
            config = load_config(run_dir)
            write_json(run_dir / "config.json", {**config, "gate": {**(config.get("gate") or {}), **asdict(gate)}})
        verdict = render_run(run_dir, gate, per_pool, cluster=cluster)
    except Exception:  # noqa: BLE001 - a report failure must not read as a gate verdict
        traceback.print_exc()
        print(f"specgate: error: rendering the report failed; rebuild it with python -m reports.render {run_dir}",
              file=sys.stderr)
        return EXIT_HARNESS_FAILED
    print(verdict.headline)
    for line in verdict.reasons:  # why it failed: each threshold passed, and per pool why numerics cannot explain it
        print(f"  - {line}")
    for line in verdict.unexercised:  # INCONCLUSIVE: what was not exercised, and what to change
        print(f"  not exercised: {line}")
    incidents = load_incidents(run_dir)
    for line, incident in zip(incident_lines(incidents), incidents, strict=True):
        print(f"incident: {line}")
        if incident.get("recovered") is False and incident.get("excerpt"):  # why a replica was given up
            print("  " + "\n  ".join(str(incident["excerpt"]).splitlines()[:12]))
    print(f"report: {run_dir / 'report.html'}")
    return verdict.exit_code


def resolve(argv: list[str] | None) -> RunConfig:
    """The config (merged with a resumed run's saved one, harness/resume.py); the sessions come with the plan
    (make_plan), built for what the pools run. What a trusted resume takes from the run directory is printed."""
    cfg, explicit = from_argv(argv, os.environ)
    if cfg.resume:
        run_dir = Path(cfg.resume)
        if run_dir.is_symlink():  # runs/latest: the run it names (its id is the directory's, not "latest")
            run_dir = run_dir.resolve()
        try:
            saved = json.loads((run_dir / "config.json").read_text())["run_config"]
            assert isinstance(saved, dict), "run_config is not an object"
        except (OSError, ValueError, KeyError, TypeError, AssertionError) as e:
            raise ConfigError(f"--resume {run_dir}: not a run directory with a readable config.json ({e})") from None
        cfg = for_resume(saved, cfg, explicit, run_dir)
        if cfg.trust_run_config:
            for line in trusted_lines(cfg, run_dir / "config.json"):
                print(line)
    return cfg


def main(argv: list[str] | None = None) -> int:
    """The CLI entry point; returns the exit status. SIGTERM unwinds like Ctrl-C (pools stopped, records kept)."""
    in_main = threading.current_thread() is threading.main_thread()  # signals reach the main thread only
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if in_main else None
    try:
        return _main(argv)
    except KeyboardInterrupt as e:  # before a run directory existed: nothing to resume
        print("\nterminated" if isinstance(e, Terminated) else "\ninterrupted", file=sys.stderr)
        return EXIT_TERMINATED if isinstance(e, Terminated) else EXIT_INTERRUPTED
    finally:
        if in_main and previous is not None:  # None: a handler not set from Python, which cannot be put back
            signal.signal(signal.SIGTERM, previous)


def _on_sigterm(signum, frame) -> None:
    raise Terminated()  # in the main thread, wherever it is: unwinds through every cleanup as Ctrl-C does


def open_run_dir(cfg: RunConfig, target: Target, plan: Plan) -> tuple[Path, RunLock]:
    """The run directory, created (with a first config.json, so a run stopped before its servers came up can be
    resumed) or the resumed one, and its writer lock (RunLocked when another process writes there)."""
    if cfg.resume:
        run_dir = Path(cfg.resume)
        lock = RunLock.acquire(run_dir)
        if lock.taken_over:
            print(f"note: took over the lock of {run_dir} from pid {lock.taken_over.get('pid')} (no longer running)")
        return run_dir, lock
    run_dir = create_run_dir(cfg.runs_dir, cfg.run_id or new_run_id(), latest=False)
    lock = RunLock.acquire(run_dir)
    try:
        write_config(run_dir, cfg, target, run_dir.name, plan, [], resumed=False)
    except BaseException:
        lock.release()
        raise
    return run_dir, lock


def _main(argv: list[str] | None) -> int:
    try:
        cfg = resolve(argv)
        target = make_target(cfg)
        # probe already-running servers before anything is written: a failed probe leaves runs/ and runs/latest
        # alone; a bad workload fails here too
        probed = make_plan(target, probe=not cfg.dry_run)
        resolve_drivers(cfg, {p.name: p.sessions for p in probed[0].candidates})  # too many --drivers: refused
        if cfg.dry_run:
            print(target.describe(probed[0]))
            return EXIT_PASS
    except (ConfigError, HarnessError) as e:
        print(f"specgate: error: {e}", file=sys.stderr)
        return EXIT_HARNESS_FAILED
    try:
        run_dir, lock = open_run_dir(cfg, target, probed[0])
    except (FileExistsError, RunLocked) as e:
        print(f"specgate: error: {e}", file=sys.stderr)
        return EXIT_HARNESS_FAILED
    except OSError as e:
        where = Path(cfg.resume or cfg.runs_dir)
        print(f"specgate: error: cannot write the run directory under {where} ({e.strerror or e}); choose a "
              "writable --runs-dir", file=sys.stderr)
        return EXIT_HARNESS_FAILED
    failed = True
    try:
        status = _run(cfg, target, run_dir, probed)
        failed = status == EXIT_HARNESS_FAILED
        return status
    except KeyboardInterrupt as e:
        failed = False  # what was recorded is kept, to be resumed
        why = "terminated (SIGTERM)" if isinstance(e, Terminated) else "interrupted"
        print(f"\n{why}; records so far are kept. Finish with: python -m harness.run --resume {run_dir}",
              file=sys.stderr)
        return EXIT_TERMINATED if isinstance(e, Terminated) else EXIT_INTERRUPTED
    finally:
        lock.release()
        if failed and not cfg.resume and discard_if_empty(run_dir):
            print(f"specgate: removed {run_dir}: the run recorded nothing", file=sys.stderr)
        elif failed:
            print(f"specgate: records so far are in {run_dir}; finish with: python -m harness.run --resume "
                  f"{run_dir}", file=sys.stderr)


def _run(cfg: RunConfig, target: Target, run_dir: Path, probed: tuple[Plan, dict[str, dict]]) -> int:
    """Start, drive, render; the exit status. A harness failure is reported here, never as a gate verdict."""
    try:
        print(f"run directory: {run_dir}")
        if probed[0].skipped_sessions:
            gated = sorted({p.engine.interval for p in probed[0].candidates if p.engine.interval})
            print(f"workload: {probed[0].skipped_sessions} of the suite's sessions are written for other intervals "
                  f"than this run gates ({', '.join(map(str, gated)) or 'none'}); they are not sent")
        progress = execute(target, run_dir, run_dir.name, probed)
    except (HarnessError, FileExistsError, RequestError) as e:
        print(f"specgate: error: {e}", file=sys.stderr)
        return EXIT_HARNESS_FAILED
    except Exception:  # noqa: BLE001 - a harness bug must not look like a gate verdict
        traceback.print_exc()
        print("specgate: error: the harness failed", file=sys.stderr)
        return EXIT_HARNESS_FAILED
    print(progress.summary())
    if progress.done == 0:
        print("specgate: error: no candidate records", file=sys.stderr)
        return EXIT_HARNESS_FAILED
    return render(run_dir, cfg)


def execute(target: Target, run_dir: Path, run_id: str, probed: tuple[Plan, dict[str, dict]] | None = None
            ) -> Progress:
    """Start the target's pools (or wrap its endpoints), read back what they run, drive, and tear down.

    `probed`: the plan (with its sessions) and the server infos from `make_plan`, before the run directory existed.
    """
    plan, infos = probed or make_plan(target)
    with target.servers(plan, run_dir, run_id) as (cands, ref):
        update_latest(run_dir)  # the servers are up: this is the run to look at (or resume)
        plan, infos = target.settle(plan, cands, ref, infos)
        progress = asyncio.run(drive(target.cfg, target, plan, cands, ref, run_dir, run_id,
                                     target.cfg.resume is not None, infos))
        for line in target.finish(run_dir):
            print(line)
    return progress


if __name__ == "__main__":
    status = main()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the run is over: a late SIGTERM must not replace its status
    sys.exit(status)
