"""`python -m harness.run`: start pools, drive the workload, write records, report and gate.

Exit status: 0 the gate passed, 1 the gate failed, 2 the harness itself failed
(bad config, no cluster, a replica or endpoint unusable, no records), 130 interrupted
(finish the run with `--resume RUN_DIR`).
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import shlex
import sys
import time
import traceback
from dataclasses import asdict, replace
from pathlib import Path

import aiohttp

from harness.backends import Backend, ReplicaFailure, RequestError, make_backend, narrowed
from harness.backends.metrics import counter_report, snapshot
from harness.cli import from_argv
from harness.config import ConfigError, RunConfig, for_resume
from harness.driver import Driver
from harness.plan import Plan, builtin_plan, external_plan
from harness.pools import HarnessError, Pool, external_pools
from harness.progress import Progress
from harness.ray_pools import RayPools
from harness.workload import describe as describe_workload
from harness.workload import load_sessions, target_of
from records.incidents import IncidentLog, load_incidents
from records.jsonl import RecordFiles, load_run
from records.rundir import create_run_dir, load_config, new_run_id, update_latest, write_json
from reports.gate import EXIT_HARNESS_FAILED, EXIT_PASS
from reports.incidents import incident_lines
from reports.render import render_run

EXIT_INTERRUPTED = 130  # Ctrl-C; the run can be finished with --resume


def vllm_workload(cfg: RunConfig) -> tuple[list, str, object]:
    """An --engine vllm run's (sessions, the plan's workload line, tokenizer), in the --model directory's tokenizer
    (no sessions for --suite vllm-boundary: derived from each server's reported block once it is up,
    harness/vllm/workload.py)."""
    target = target_of(cfg, {})
    sessions, left_out = load_sessions(cfg, target)
    return sessions, describe_workload(cfg, target, left_out), target.tokenizer


def backend_of(cfg: RunConfig) -> Backend:
    """The backend that speaks to this run's servers (--backend; built-in replicas speak sglang)."""
    return make_backend(cfg.backend, cfg.api_key, cfg.tokenizer,
                        {"intervals": cfg.intervals, "block_size": cfg.block_size})


async def probe_endpoints(cfg: RunConfig, backend: Backend, generate_probe: bool) -> dict[str, dict]:
    """Each endpoint's settings, checked for its role; with `generate_probe`, also one short request each."""
    roles = [(u, "candidate") for u in cfg.endpoint] + [(u, "reference") for u in cfg.reference_endpoint]
    async with aiohttp.ClientSession() as http:
        infos = await asyncio.gather(*(backend.probe(http, u, role, generate=generate_probe) for u, role in roles))
    return dict(zip([u for u, _ in roles], infos, strict=True))


def make_plan(cfg: RunConfig, sessions: list | None, probe: bool, backend: Backend | None = None
              ) -> tuple[Plan, dict[str, dict]]:  # sessions: given (tests), else built for the target
    """The run plan; for external endpoints this contacts them (probe: also one short request each) and builds
    the sessions for what they report (intervals, block size, tokenizer); ConfigError / HarnessError."""
    if not cfg.external:
        target = target_of(cfg, {})
        sessions, left_out = load_sessions(cfg, target) if sessions is None else (sessions, 0)
        return replace(builtin_plan(cfg, sessions), workload=describe_workload(cfg, target, left_out),
                       tokenizer=target.tokenizer), {}
    try:
        infos = asyncio.run(probe_endpoints(cfg, backend or backend_of(cfg), probe))
    except (RequestError, ReplicaFailure) as e:
        raise HarnessError(str(e)) from None
    target = target_of(cfg, infos)
    sessions, left_out = load_sessions(cfg, target)
    try:
        plan = external_plan(cfg, sessions, infos)
    except ValueError as e:
        raise HarnessError(str(e)) from None
    return replace(plan, workload=describe_workload(cfg, target, left_out), tokenizer=target.tokenizer), infos


def write_config(run_dir: Path, cfg: RunConfig, run_id: str, plan: Plan, pools: list[Pool],
                 resumed: bool) -> None:
    """config.json: the RunConfig, run id, engine settings per pool, gate thresholds."""
    path = run_dir / "config.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    was, now = old.get("plan") or {}, (plan.workload, plan.tokenizer.name if plan.tokenizer is not None else None)
    if resumed and was and (was.get("workload"), was.get("tokenizer")) != now:
        # the same session ids with other prompts would mix two workloads in one run (records are keyed by id)
        raise HarnessError(f"--resume: the servers now make a different workload ({now[0]}; tokenizer {now[1]}) "
                           f"than the run was started with ({was.get('workload')}; tokenizer "
                           f"{was.get('tokenizer')}): start a new run")
    doc = {
        "run_id": run_id,
        "created": old.get("created", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())),
        "resumed": old.get("resumed", []) + ([time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())] if resumed
                                             else []),
        "run_config": cfg.to_json(),
        "gate": asdict(cfg.gate),
        "narrowed": narrowed({p.name: p.server_info for p in pools}),  # what each pool's servers cannot report
        "pools": {p.name: {"role": p.role, "engine": p.engine.record(), "server_info": p.server_info,
                           "replicas": [{"replica_id": r.replica_id, "url": r.url, "node_id": r.node_id}
                                        for r in p.replicas]} for p in pools},
        "plan": {"concurrency": list(plan.concurrency), "skipped_sessions": plan.skipped_sessions,
                 "total_candidate_requests": plan.total_candidate_requests, "workload": plan.workload,
                 "tokenizer": plan.tokenizer.name if plan.tokenizer is not None else None,
                 "requests_per_point": {p.name: p.requests_per_point for p in plan.candidates}},
        "host": {"python": platform.python_version(), "platform": platform.platform()},
    }
    write_json(path, doc)


async def drive(cfg: RunConfig, plan: Plan, cands: list[Pool], ref: Pool, run_dir: Path, run_id: str,
                resumed: bool, infos: dict[str, dict]) -> Progress:
    """Read each pool's /server_info, write config.json, run the driver; return the final counters."""
    recorded = load_run(run_dir)
    existing, existing_refs = recorded.candidates_by_key(), recorded.references
    tokenizer = plan.tokenizer.name if plan.tokenizer is not None else "unknown"
    incidents = IncidentLog(run_dir)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        for pool in (*cands, ref):
            url = pool.replicas[0].url
            pool.server_info = infos.get(url) or await pool.backend.server_info(http, url)
            pool.incidents = incidents
            reported = pool.server_info.get("mamba_track_interval")
            if pool.role == "candidate" and reported is not None and int(reported) != pool.engine.interval:
                raise HarnessError(f"pool {pool.name}: the server reports mamba_track_interval {reported}")
        write_config(run_dir, cfg, run_id, plan, [*cands, ref], resumed)
        sessions = {p.name: p.sessions for p in plan.candidates}
        recorded = sum(1 for k in existing if any(k.startswith(p.name + "-c") for p in plan.candidates))
        progress = Progress(plan.total_candidate_requests, recorded,
                            enabled=not cfg.no_progress and sys.stderr.isatty())
        files = RecordFiles(run_dir, set(existing) | {f"ref/{h}" for h in existing_refs})
        driver = Driver(run_id=run_id, concurrency=cfg.concurrency, candidates=cands, reference=ref, files=files,
                        http=http, progress=progress, existing=existing, existing_refs=existing_refs,
                        request_timeout=cfg.request_timeout, max_retries=cfg.max_retries,
                        reference_concurrency=cfg.reference_concurrency, sequential_pools=cfg.sequential_pools,
                        api_key=cfg.api_key, tokenizers={p.name: tokenizer for p in (*cands, ref)},
                        decode=plan.tokenizer.decode if plan.tokenizer is not None else None)
        before = await snapshot(http, [*cands, ref])
        try:
            await driver.run(sessions)
            write_json(run_dir / "server_counters.json", counter_report(before, await snapshot(http, [*cands, ref])))
        finally:
            files.close()
            progress.close()
    return progress


def render(run_dir: Path, cfg: RunConfig) -> int:
    """Tables, plots, report and the gate's verdict (with --calibrate, thresholds from the baseline pool);
    returns the exit status."""
    try:
        gate = cfg.gate
        if cfg.calibrate:
            from harness.calibrate import calibrated_gate

            gate = calibrated_gate(run_dir, gate, cfg.drift_tolerance is not None)
            print(f"calibration: {load_config(run_dir)['calibration']['text']}")
        verdict = render_run(run_dir, gate)
    except Exception:  # noqa: BLE001 - a report failure must not read as a gate verdict
        traceback.print_exc()
        print(f"specgate: error: rendering the report failed; rebuild it with python -m reports.render {run_dir}",
              file=sys.stderr)
        return EXIT_HARNESS_FAILED
    print(verdict.headline)
    incidents = load_incidents(run_dir)
    for line, incident in zip(incident_lines(incidents), incidents, strict=True):
        print(f"incident: {line}")
        if incident.get("recovered") is False and incident.get("excerpt"):  # why a replica was given up
            print("  " + "\n  ".join(str(incident["excerpt"]).splitlines()[:12]))
    print(f"report: {run_dir / 'report.html'}")
    return verdict.exit_code


def resolve(argv: list[str] | None) -> RunConfig:
    """The config (merged with a resumed run's saved one); the sessions come with the plan (make_plan), built
    for what the pools run."""
    cfg, explicit = from_argv(argv, os.environ)
    if cfg.resume:
        run_dir = Path(cfg.resume)
        try:
            saved = json.loads((run_dir / "config.json").read_text())["run_config"]
        except (OSError, ValueError, KeyError) as e:
            raise ConfigError(f"--resume {run_dir}: not a run directory with a readable config.json ({e})") from None
        cfg = for_resume(saved, cfg, explicit, run_dir)
        if cfg.trust_run_config and cfg.server_command:
            print(f"--trust-run-config: running the server command stored in {run_dir / 'config.json'}: "
                  f"{shlex.join(cfg.server_command)}")
    return cfg


def main(argv: list[str] | None = None) -> int:
    """The CLI entry point; returns the exit status."""
    try:
        cfg = resolve(argv)
        vllm_work = None
        if cfg.engine == "vllm" and not cfg.external:
            vllm_work = vllm_workload(cfg)  # a bad workload fails before anything is written
            if cfg.dry_run:
                from harness.vllm.start import describe_run

                print(describe_run(cfg, *vllm_work[:2]))
                return EXIT_PASS
        backend = backend_of(cfg)
        if cfg.dry_run:
            plan, _ = make_plan(cfg, None, probe=False, backend=backend)
            print(plan.describe(cfg))
            return EXIT_PASS
        # probe external endpoints before anything is written: a failed probe leaves runs/ and runs/latest alone;
        # a bad workload fails here too
        probed = None if cfg.engine == "vllm" and not cfg.external else \
            make_plan(cfg, None, probe=cfg.external, backend=backend)
    except (ConfigError, HarnessError) as e:
        print(f"specgate: error: {e}", file=sys.stderr)
        return EXIT_HARNESS_FAILED
    run_dir = Path(cfg.resume) if cfg.resume else None
    try:
        if run_dir is None:
            run_dir = create_run_dir(cfg.runs_dir, cfg.run_id or new_run_id())
        else:
            update_latest(run_dir)
    except FileExistsError as e:
        print(f"specgate: error: {e}", file=sys.stderr)
        return EXIT_HARNESS_FAILED
    except OSError as e:
        where = run_dir or Path(cfg.runs_dir)
        print(f"specgate: error: cannot write the run directory under {where} ({e.strerror or e}); choose a "
              "writable --runs-dir", file=sys.stderr)
        return EXIT_HARNESS_FAILED
    try:
        print(f"run directory: {run_dir}")
        if probed is not None and probed[0].skipped_sessions:
            print(f"note: {probed[0].skipped_sessions} session(s) target an interval with no pool; they are skipped")
        progress = execute(cfg, run_dir, run_id=run_dir.name, backend=backend, probed=probed, vllm_work=vllm_work)
    except KeyboardInterrupt:
        if run_dir is not None:
            print(f"\ninterrupted; records so far are kept. Finish with: python -m harness.run --resume {run_dir}",
                  file=sys.stderr)
        return EXIT_INTERRUPTED
    except (HarnessError, FileExistsError, RequestError) as e:
        print(f"specgate: error: {e}", file=sys.stderr)
        return EXIT_HARNESS_FAILED
    except Exception:  # noqa: BLE001 - a harness bug must not look like a gate verdict
        traceback.print_exc()
        print(f"specgate: error: the harness failed; records so far are in {run_dir}", file=sys.stderr)
        return EXIT_HARNESS_FAILED
    print(f"candidates: {progress.done} recorded, {progress.errors} errors, {progress.mismatches} mismatches "
          f"(output ids differ from the reference), {progress.retries} retries")
    if progress.done == 0:
        print("specgate: error: no candidate records", file=sys.stderr)
        return EXIT_HARNESS_FAILED
    return render(run_dir, cfg)


def execute(cfg: RunConfig, run_dir: Path, run_id: str, backend: Backend | None = None,
            probed: tuple[Plan, dict[str, dict]] | None = None, vllm_work: tuple | None = None) -> Progress:
    """Start the pools (Ray replicas or external endpoints), drive, and tear down.

    `probed`: the plan (with its sessions) and the server infos of external endpoints, already probed (with
    `backend`, which keeps what its probes learned). `vllm_work`: an --engine vllm run's `vllm_workload`.
    """
    resumed = cfg.resume is not None
    backend = backend or backend_of(cfg)
    if cfg.engine == "vllm" and not cfg.external:
        from harness.vllm.start import execute_vllm

        return execute_vllm(cfg, vllm_work or vllm_workload(cfg), run_dir, run_id, drive)
    plan, infos = probed or make_plan(cfg, None, probe=cfg.external, backend=backend)
    if cfg.external:
        cands, ref = external_pools(plan, cfg.api_key, cfg.recover_timeout, backend)
        return asyncio.run(drive(cfg, plan, cands, ref, run_dir, run_id, resumed, infos))
    pools = RayPools(cfg, plan, run_id)
    try:
        pools.connect()
        cands, ref = pools.start()
        return asyncio.run(drive(cfg, plan, cands, ref, run_dir, run_id, resumed, {}))
    finally:
        pools.close()


if __name__ == "__main__":
    sys.exit(main())
