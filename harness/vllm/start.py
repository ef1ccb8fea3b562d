"""A vLLM run: its plan, and what the started servers report about themselves.

The plan's pools come from harness/vllm/profile.py; once the servers are up,
each is probed through the OpenAI backend (one short request, /metrics): its
prefix-cache block (`vllm:cache_config_info`) becomes the candidate's checkpoint
interval, and a server that runs something else than its flags asked (prefix
caching silently off on a hybrid, say) stops the run with a message that says so.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json

import aiohttp

from harness.backends import ReplicaFailure, RequestError
from harness.plan import REFERENCE_POOL, Plan, PoolPlan
from harness.vllm.profile import engine_spec, make_pool, pools


def vllm_plan(cfg, work: tuple) -> Plan:
    """Pools of a vLLM run; each candidate pool serves every session (their interval is the server's block).
    `work`: (sessions, the workload line, the target's tokenizer) from harness.run.vllm_workload."""
    sessions, workload, tokenizer = work
    cands, ref = pools(cfg.candidate_args, cfg.diagnose, cfg.calibrate)
    plans = tuple(PoolPlan(p.name, "candidate", engine_spec(p), cfg.replicas, tuple(sessions)) for p in cands)
    return Plan(plans, PoolPlan(REFERENCE_POOL, "reference", engine_spec(ref), cfg.reference_replicas),
                cfg.concurrency, 0, workload=workload, tokenizer=tokenizer)


def check_reported(name: str, asked, info: dict) -> str | None:
    """Why a server's /metrics contradict what its pool asked for (None when they agree)."""
    from harness.backends.info import speculative

    declared = info.get("specgate_probe", {}).get("declared", [])
    if "disable_radix_cache" not in info or "disable_radix_cache" in declared:
        return None  # not reported: nothing to contradict
    caching = not info["disable_radix_cache"]
    if asked.prefix_caching != caching:
        return (f"pool {name}: asked for prefix caching {'on' if asked.prefix_caching else 'off'}, the server "
                f"reports it {'on' if caching else 'off'} (vllm:cache_config_info); vLLM overrode the flag for "
                "this model: the combination cannot be gated as asked")
    if asked.speculative and not speculative(info):
        return f"pool {name}: asked for speculative decoding, the server's /metrics show none"
    return None


async def _probe(backend, http, url: str, role: str) -> dict:
    """backend.probe; a candidate whose probe request fails on the server's side (HTTP 5xx, connection lost:
    it crashed on its first request) is probed for its settings only and kept, so the run records the crash as
    the candidate's failure (exit 1), with its log lines, instead of stopping as a harness failure."""
    try:
        return await backend.probe(http, url, role)
    except RequestError as e:
        if role != "candidate" or not ("HTTP 5" in str(e) or "failed (" in str(e) and "HTTP" not in str(e)):
            raise
        print(f"[specgate] candidate {url}: {e}; the run goes on and records what it does")
        try:
            info = await backend.probe(http, url, role, generate=False)
        except (RequestError, ReplicaFailure):
            info = {"specgate_probe": {"declared": [], "notes": []}}
        info.setdefault("specgate_probe", {}).setdefault("notes", []).append(f"probe request failed: {e}")
        return info


async def probe_pools(cands: list, ref, backend) -> dict[str, dict]:
    """Probe every replica (role-checked); set each pool's server_info and engine (interval = reported block).

    Returns URL -> server info. RequestError when a server cannot serve its role or contradicts its flags.
    """
    infos: dict[str, dict] = {}
    async with aiohttp.ClientSession() as http:
        for pool in (*cands, ref):
            asked = make_pool(pool.name, pool.role, pool.engine.args)
            for r in pool.replicas:
                info = await _probe(backend, http, r.url, pool.role)
                problem = check_reported(pool.name, asked, info)
                if problem:
                    raise RequestError(problem)
                infos[r.url] = info
            pool.server_info = infos[pool.replicas[0].url]
            interval = pool.server_info.get("mamba_track_interval")
            pool.engine = engine_spec(asked, int(interval) if interval else None)
    return infos


def derived_sessions(cfg, cands: list) -> tuple:
    """`--suite vllm-boundary`: cases around the largest block the caching candidates report."""
    from harness.pools import HarnessError
    from harness.vllm.workload import boundary_sessions
    from protocol.tokenizer import TokenizerError

    blocks = [p.engine.interval for p in cands if p.engine.interval]
    if not blocks:
        raise HarnessError("--suite vllm-boundary places cases around the prefix-cache block, and no candidate "
                           "reports one (no prefix caching): use --suite frozen")
    speculative = [p.engine.block_size for p in cands if p.engine.block_size]
    try:
        sessions = boundary_sessions(cfg.tokenizer or cfg.model_path, max(blocks), max(speculative, default=None))
    except (TokenizerError, ValueError, OSError) as e:
        raise HarnessError(f"--suite vllm-boundary: {e}") from None
    print(f"suite vllm-boundary: {len(sessions)} sessions around multiples of block {max(blocks)}")
    return tuple(sessions)


def settled_plan(plan: Plan, cands: list, sessions: tuple | None = None) -> Plan:
    """The plan with each candidate's engine as its servers reported it (and, if given, these sessions)."""
    engines = {p.name: p.engine for p in cands}
    fixed = tuple(PoolPlan(p.name, p.role, engines[p.name], p.replicas, p.sessions if sessions is None else sessions)
                  for p in plan.candidates)
    return dataclasses.replace(plan, candidates=fixed)


def run_probe(cands: list, ref, backend) -> dict[str, dict]:
    """probe_pools from synchronous code."""
    return asyncio.run(probe_pools(cands, ref, backend))


def summary(infos: dict[str, dict]) -> str:
    """One line per server: what it reported (for the log)."""
    keys = ("mamba_track_interval", "speculative_algorithm", "speculative_num_draft_tokens", "disable_radix_cache")
    return "\n".join(f"  {url}: " + json.dumps({k: info.get(k) for k in keys}) for url, info in infos.items())


def describe_run(cfg, sessions: list, workload: str = "") -> str:
    """What `--dry-run` prints for --engine vllm (nothing is started)."""
    from harness.vllm import VLLMNotFound, find_python
    from harness.vllm.profile import describe

    try:
        python = find_python(cfg.vllm_python)
    except VLLMNotFound as e:
        python = f"<no vLLM interpreter: {e}>"
    cands, ref = pools(cfg.candidate_args, cfg.diagnose, cfg.calibrate)
    text = describe(cfg, python, cands, ref, len(sessions))
    return text + (f"\nworkload: {workload}" if workload else "")


def backend_for(cfg, api_key: str):
    """The OpenAI backend of a vLLM run: the run's key, the model directory as the tokenizer. A server without
    prefix caching has no checkpoint interval: declared None (listed as unknown), never guessed."""
    from harness.backends.openai import OpenAIBackend

    return OpenAIBackend(api_key, cfg.tokenizer or cfg.model_path, {"intervals": (None,), "block_size": None})


def execute_vllm(cfg, work: tuple, run_dir, run_id: str, drive):
    """Start the vLLM pools under Ray (logs in RUN_DIR/logs on a local Ray), probe them, drive, tear down."""
    from harness.pools import HarnessError
    from harness.ray_pools import RayPools
    from harness.vllm import VLLMNotFound

    plan = vllm_plan(cfg, work)
    log_dir = str(run_dir.resolve() / "logs") if not cfg.address else None
    pools_ = RayPools(cfg, plan, run_id, log_dir=log_dir)
    pools_.backend = backend_for(cfg, pools_.api_key)
    try:
        pools_.connect()
        try:
            cands, ref = pools_.start()
        except VLLMNotFound as e:
            raise HarnessError(str(e)) from None
        try:
            infos = run_probe(cands, ref, pools_.backend)
        except (RequestError, ReplicaFailure) as e:
            raise HarnessError(str(e)) from None
        print("vLLM servers report:\n" + summary(infos))
        derived = derived_sessions(cfg, cands) if cfg.suite == "vllm-boundary" else None
        plan = settled_plan(plan, cands, derived)
        progress = asyncio.run(drive(cfg, plan, cands, ref, run_dir, run_id, cfg.resume is not None, infos))
        for line in acceptance_lines(run_dir / "server_counters.json"):
            print(line)
        return progress
    finally:
        pools_.close()


def acceptance_lines(path) -> list[str]:
    """Per speculating pool: vLLM's draft acceptance over the run, from its /metrics counters."""
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    lines = []
    for pool, urls in report.items():
        delta = {k: sum(e["delta"].get(k, 0.0) for e in urls.values())
                 for k in ("vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total",
                           "vllm:spec_decode_num_drafts_total", "vllm:prefix_cache_hits_total",
                           "vllm:prefix_cache_queries_total")}
        drafted, accepted = delta["vllm:spec_decode_num_draft_tokens_total"], \
            delta["vllm:spec_decode_num_accepted_tokens_total"]
        parts = []
        if drafted:
            parts.append(f"accept rate {accepted / drafted:.1%} ({accepted:.0f}/{drafted:.0f} draft tokens), "
                         f"mean accepted length {1 + accepted / max(delta['vllm:spec_decode_num_drafts_total'], 1):.2f}"
                         " per verify step")
        if delta["vllm:prefix_cache_queries_total"]:
            parts.append(f"prefix cache hits {delta['vllm:prefix_cache_hits_total']:.0f}/"
                         f"{delta['vllm:prefix_cache_queries_total']:.0f} tokens")
        if parts:
            lines.append(f"pool {pool} (/metrics): " + "; ".join(parts))
    return lines
