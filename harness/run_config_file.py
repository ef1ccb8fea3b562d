"""config.json of a run directory: the RunConfig, the run id, each pool's engine and server info, where each started
replica sits (node, GPU ids, CUDA_VISIBLE_DEVICES, device), the plan."""

from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from harness.errors import HarnessError
from records.rundir import write_json

if TYPE_CHECKING:
    from harness.config import RunConfig
    from harness.plan import Plan
    from harness.pools import Pool
    from harness.targets import Target


def write_config(run_dir: Path, cfg: RunConfig, target: Target, run_id: str, plan: Plan, pools: list[Pool],
                 resumed: bool, window_unprobed: str | None = None) -> None:
    """config.json: the RunConfig, run id, what the target says of itself, engine settings per pool, gate thresholds;
    `window_unprobed`: why the servers' protocol sends no restore-window probe (None: it sends them)."""
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
        # what the target says of itself: the report reads these, never the target's name
        "target": {"key": cfg.key, "noisy": cfg.target.noisy, "drift_tolerance": cfg.target.drift_tolerance,
                   "window_unprobed": target.window_unprobed(window_unprobed)},
        "gate": asdict(cfg.gate),
        # --deterministic: what confirms, per pool, that its servers run the target's deterministic mode
        "deterministic": {p.name: target.deterministic(p, p.server_info)[1] for p in pools} if cfg.deterministic
        else None,
        # what each pool's servers cannot report
        "narrowed": {p.name: list(target.reported(p.server_info).unknown) for p in pools},
        "pools": {p.name: {"role": p.role, "engine": p.engine.record(), "server_info": p.server_info,
                           "replicas": [{"replica_id": r.replica_id, "url": r.url, "node_id": r.node_id,
                                         **({"placement": r.placement} if r.placement is not None else {})}
                                        for r in p.replicas]} for p in pools},
        "plan": {"concurrency": list(plan.concurrency), "skipped_sessions": plan.skipped_sessions,
                 "total_candidate_requests": plan.total_candidate_requests, "workload": plan.workload,
                 "tokenizer": plan.tokenizer.name if plan.tokenizer is not None else None,
                 "requests_per_point": {p.name: p.requests_per_point for p in plan.candidates}},
        "host": {"python": platform.python_version(), "platform": platform.platform()},
    }
    write_json(path, doc)
