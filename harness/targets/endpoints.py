"""Already-running servers (`--endpoint`, `--reference-endpoint`), spoken to through either backend.

Nothing is started: each endpoint is probed before the run writes anything (its
settings, and one short request for what its answers carry), candidates are grouped
into one pool per checkpoint interval they report, and the workload is built for what
they report (intervals, the largest block size, their tokenizer, their context).
A server that cannot take its role (a candidate without speculation or radix cache,
a reference with either) is refused, naming its URL.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp

from harness.backends import Backend, ReplicaFailure, RequestError, make_backend
from harness.config import TargetSettings
from harness.errors import ConfigError, HarnessError
from harness.plan import REFERENCE_POOL, EngineSpec, Plan, PoolPlan, sessions_for, skipped
from harness.pools import Pool, external_pools
from harness.settings import Need, setting
from harness.targets.base import DETERMINISTIC_KEY, Target, reported_settings
from harness.workload import WorkloadTarget, load_target_tokenizer

if TYPE_CHECKING:
    from harness.config import RunConfig


@dataclass(frozen=True)
class EndpointsSettings(TargetSettings):
    """Servers that already run: the candidates' and the cold-path reference's URLs."""

    key = "endpoints"
    managed = False
    chosen_by = ("endpoint", "reference_endpoint")
    # a control pool is a server of its own, which only a started target has; devices are the running servers' own
    refuses = frozenset({"calibrate", "device", "gpus_per_rank"})

    endpoint: tuple[str, ...] = setting((), "strs", "an already-running candidate server (repeatable); no Ray "
                                        "replicas then", resume="fixed")
    reference_endpoint: tuple[str, ...] = setting((), "strs", "an already-running cold-path server (repeatable)",
                                                  resume="fixed")

    def __post_init__(self) -> None:
        for name in ("endpoint", "reference_endpoint"):  # a server is the same whatever its trailing slash
            object.__setattr__(self, name, tuple(u.rstrip("/") for u in getattr(self, name)))

    def refused(self, name: str, offered_by: tuple[str, ...]) -> str:
        if name == "calibrate":
            return (f"--calibrate needs --engine {' or '.join(offered_by) or 'KEY'} (it starts clean control servers); "
                    "calibrate --endpoint servers from a trusted run's records with --baseline-run RUN_DIR")
        if name in ("device", "gpus_per_rank"):
            return (f"--{name.replace('_', '-')} places the replicas the harness starts; --endpoint servers run "
                    "where they already are")
        return f"--{name.replace('_', '-')} configures built-in replicas; it does not apply to --endpoint servers"

    def validate(self, run: RunConfig, need: Need) -> None:
        """URLs, and both sides given: candidates and their cold-path oracle."""
        super().validate(run, need)
        for url in self.endpoint + self.reference_endpoint:
            need(re.match(r"^https?://[^/\s]+", url) is not None,
                 f"--endpoint / --reference-endpoint must be http(s)://host:port URLs, got {url!r}")
        need(not self.reference_endpoint or self.endpoint,
             "--reference-endpoint needs --endpoint (external candidates)")
        need(not self.endpoint or self.reference_endpoint,
             "--endpoint needs --reference-endpoint: the cold-path oracle for an external engine must be "
             "the same model, served without speculation and without radix cache")


def engine_from_server_info(info: dict, url: str) -> EngineSpec:
    """The EngineSpec an external server reports in /server_info (SGLang's server-args names)."""
    r = reported_settings(info)  # DFlash builds may report speculative_dflash_block_size only; either strategy key
    return EngineSpec(interval=r.interval, block_size=r.block_size, strategy=r.strategy,
                      tp=int(info.get("tp_size") or 1), fault=info.get("inject_fault"), speculative=r.speculative,
                      radix_cache=r.radix_cache)


def role_problem(url: str, role: str, info: dict) -> str | None:
    """Why the server at `url` cannot be a `role` ("candidate" / "reference"); None when it can."""
    e = engine_from_server_info(info, url)
    if role == "reference":
        if e.speculative or e.radix_cache:
            return (f"reference endpoint {url}: the oracle must run without speculation and with "
                    "--disable-radix-cache")
        return None
    if e.interval is None:
        return (f"endpoint {url}: /server_info has no mamba_track_interval; specgate needs a hybrid model served "
                "with a mamba radix cache")
    if not e.speculative or not e.radix_cache:
        return (f"endpoint {url}: a candidate must run speculative decoding with the radix cache "
                f"(speculative_algorithm={info.get('speculative_algorithm')}, "
                f"disable_radix_cache={info.get('disable_radix_cache')})")
    return None


def external_plan(cfg: RunConfig, sessions: list, infos: dict[str, dict]) -> Plan:
    """Pools of external servers, grouped by the interval each reports; `infos` maps URL -> /server_info.

    Raises ValueError naming the endpoint when its settings do not fit its role.
    """
    by_interval: dict[int, list[tuple[str, EngineSpec]]] = {}
    for url in cfg.target.endpoint:
        problem = role_problem(url, "candidate", infos[url])
        if problem:
            raise ValueError(problem)
        e = engine_from_server_info(infos[url], url)
        by_interval.setdefault(e.interval, []).append((url, e))
    cands = []
    for interval, members in sorted(by_interval.items()):
        blocks = {e.block_size for _, e in members}
        if len(blocks) > 1:
            raise ValueError(f"endpoints with interval {interval} disagree on the block size: {sorted(blocks)}")
        urls = tuple(u for u, _ in members)
        cands.append(PoolPlan(f"i{interval}", "candidate", members[0][1], len(urls),
                              sessions_for(sessions, interval), urls, tuple(infos[u] for u in urls)))
    for url in cfg.target.reference_endpoint:
        problem = role_problem(url, "reference", infos[url])
        if problem:
            raise ValueError(problem)
    refs = cfg.target.reference_endpoint
    ref = PoolPlan(REFERENCE_POOL, "reference", engine_from_server_info(infos[refs[0]], refs[0]), len(refs),
                   endpoints=refs, server_infos=tuple(infos[u] for u in refs))
    return Plan(tuple(cands), ref, cfg.concurrency, skipped(sessions, set(by_interval)))


def tokenizer_spec(cfg: RunConfig, infos: dict[str, dict]) -> tuple[str | None, str]:
    """(the tokenizer to load, where that came from): --tokenizer, else what every candidate reports (a readable
    local tokenizer_path, or `tokenizer: byte`); (None, why) when one's is unknown."""
    if cfg.tokenizer:
        return cfg.tokenizer, "--tokenizer"
    specs = {}
    for url in cfg.target.endpoint:
        r = reported_settings(infos.get(url) or {})
        if r.tokenizer_path is not None and Path(r.tokenizer_path).expanduser().exists():
            specs[url] = r.tokenizer_path
        elif r.tokenizer == "byte":
            specs[url] = "byte"
        else:
            return None, (f"endpoint {url} reports tokenizer_path {(infos.get(url) or {}).get('tokenizer_path')!r}, "
                          "which is not a readable local path")
    distinct = sorted(set(specs.values()))
    if len(distinct) > 1:
        raise ConfigError(f"the candidate endpoints report different tokenizers ({', '.join(distinct)}); pass "
                          "--tokenizer with the one they all serve")
    return distinct[0], f"{cfg.target.endpoint[0]}/server_info tokenizer_path"


class EndpointsTarget(Target):
    """Servers given by URL; their settings are what they report, never assumed."""

    settings_class = EndpointsSettings
    settings: EndpointsSettings

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self._backend: Backend | None = None  # the probes' findings (model names, capabilities) stay in it

    def backend(self, api_key: str | None = None) -> Backend:
        """--backend with --api-key, --tokenizer and the flags' intervals and block size (for what a server does
        not report); one instance for the probes and the run."""
        if self._backend is None:
            cfg = self.cfg
            self._backend = make_backend(cfg.backend, cfg.api_key, cfg.tokenizer,
                                         {"intervals": cfg.intervals, "block_size": cfg.block_size})
        return self._backend

    def probe(self, generate: bool) -> dict[str, dict]:
        """Each endpoint's settings, checked for its role; with `generate`, also one short request each."""
        try:
            return asyncio.run(self._probe_all(generate))
        except (RequestError, ReplicaFailure) as e:
            raise HarnessError(str(e)) from None

    async def _probe_all(self, generate: bool) -> dict[str, dict]:
        s, backend = self.settings, self.backend()
        roles = [(u, "candidate") for u in s.endpoint] + [(u, "reference") for u in s.reference_endpoint]
        async with aiohttp.ClientSession() as http:
            infos = await asyncio.gather(*(backend.probe(http, u, role, generate=generate) for u, role in roles))
        return dict(zip([u for u, _ in roles], infos, strict=True))

    def workload(self, infos: dict[str, dict]) -> WorkloadTarget:
        """The intervals the candidates report, their largest block size (its offsets -B..+1 hold the smaller
        blocks' too), their tokenizer and their shortest context."""
        spec, source = tokenizer_spec(self.cfg, infos)
        tokenizer = load_target_tokenizer(spec) if spec is not None else None
        reports = [reported_settings(infos.get(u) or {}) for u in self.cfg.target.endpoint]
        intervals = tuple(sorted({r.interval for r in reports if r.interval}))
        blocks = [r.block_size for r in reports if r.block_size]
        contexts = [r.context for r in reports if r.context]
        return WorkloadTarget(intervals or tuple(self.cfg.intervals), max(blocks) if blocks else self.cfg.block_size,
                              tokenizer, source, min(contexts) if contexts else None)

    def plan(self, sessions: list, infos: dict[str, dict]) -> Plan:
        try:
            return external_plan(self.cfg, sessions, infos)
        except ValueError as e:
            raise HarnessError(str(e)) from None

    def describe(self, plan: Plan) -> str:
        return plan.describe(self.cfg)

    @contextmanager
    def servers(self, plan: Plan, run_dir: Path, run_id: str) -> Iterator[tuple[list[Pool], Pool]]:
        """The endpoints as pools, spoken to through the backend that probed them."""
        yield external_pools(plan, self.cfg.api_key, self.cfg.recover_timeout, self.backend())

    def check_reported(self, pool, url: str, info: dict) -> str | None:
        return role_problem(url, pool.role, info) or super().check_reported(pool, url, info)

    def deterministic(self, pool, info: dict) -> tuple[str | None, str]:
        """Servers the harness did not start: --deterministic is the user's word that they run in their deterministic
        mode. Where a server reports it (the built-in engine, SGLang) the report is checked; where it cannot (vLLM:
        VLLM_BATCH_INVARIANT is an environment variable) the user's word stands, and config.json says so."""
        if DETERMINISTIC_KEY not in info:
            return None, f"asserted by --deterministic (the server does not report {DETERMINISTIC_KEY})"
        return super().deterministic(pool, info)
