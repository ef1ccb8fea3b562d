"""The run plan: which pools exist, what their servers run, which sessions each pool serves.

Pure functions of the RunConfig and the workload (plus, for external endpoints,
their /server_info), so `--dry-run` prints exactly what a run would do.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from engine.config import EngineConfig
from engine.server.config import to_argv
from harness.backends.info import block_size_of, probe_lines, strategy_of
from harness.backends.info import speculative as reports_speculation
from harness.config import RunConfig
from harness.engine_args import check_config, engine_overrides

REFERENCE_POOL = "reference"
DEFAULT_SERVER_COMMAND = ("python", "-m", "engine.serve")  # a leading python is the replica's interpreter
# --diagnose pools beside the full candidate `i<I>`: name suffix -> (speculative, radix cache)
DIAGNOSE_VARIANTS = {"spec": (True, False), "cache": (False, True)}


@dataclass(frozen=True)
class EngineSpec:
    """What one pool's servers run. `record()` is the records' `engine` object.

    `args`: extra engine flags of the pool (--candidate-args, --cover), kept verbatim; the built-in
    engine's pools turn them into EngineConfig overrides (harness/engine_args.py).
    """

    interval: int | None
    block_size: int | None
    strategy: str | None
    tp: int
    fault: str | None
    speculative: bool
    radix_cache: bool
    args: tuple[str, ...] = ()

    def record(self, endpoint: str | None = None) -> dict:
        return {"interval": self.interval, "block_size": self.block_size, "strategy": self.strategy,
                "tp": self.tp, "fault": self.fault, "speculative": self.speculative,
                "radix_cache": self.radix_cache, "endpoint": endpoint, "args": list(self.args)}


def candidate_engine(cfg: RunConfig, interval: int, speculative: bool = True, radix_cache: bool = True) -> EngineSpec:
    """A candidate pool: DFlash with the radix cache's extra_buffer checkpoints every `interval` tokens
    (or, for --diagnose, one of the two without the other)."""
    return EngineSpec(interval, cfg.block_size if speculative else None, "extra_buffer" if radix_cache else None,
                      cfg.tp_size, cfg.inject_fault, speculative, radix_cache, cfg.candidate_engine_args)


def reference_engine(cfg: RunConfig) -> EngineSpec:
    """The cold path: no speculation, no radix cache, never a fault (it is the oracle)."""
    return EngineSpec(None, None, None, cfg.tp_size, None, False, False)


def _base_config(cfg: RunConfig, engine: EngineSpec) -> dict:
    kw: dict = {"model_path": cfg.model_path, "tp_size": cfg.tp_size}
    if cfg.model_preset:
        kw["model_preset"] = cfg.model_preset
    if cfg.page_size:
        kw["page_size"] = cfg.page_size
    # without a radix cache the interval is unused, but must still satisfy the engine's page check
    kw["mamba_track_interval"] = engine.interval or cfg.intervals[0]
    if engine.speculative:
        kw.update(speculative_algorithm="DFLASH", speculative_num_draft_tokens=engine.block_size)
    else:
        kw["speculative_algorithm"] = "NONE"
    if engine.radix_cache:
        kw["mamba_radix_cache_strategy"] = engine.strategy
    else:
        kw["disable_radix_cache"] = True
    if engine.fault:
        kw["inject_fault"] = engine.fault
    return kw


def engine_config(cfg: RunConfig, engine: EngineSpec) -> EngineConfig:
    """The built-in engine's settings for a pool's replicas (what their ranks and servers are built from)."""
    return EngineConfig(**{**_base_config(cfg, engine), **engine_overrides(engine.args)})


def check_candidate_engines(cfg: RunConfig) -> None:
    """Raise EngineArgsError (naming the flag) if a candidate pool's EngineConfig would be invalid."""
    for interval in cfg.intervals:
        for speculative, radix in ((True, True), *DIAGNOSE_VARIANTS.values()):
            engine = candidate_engine(cfg, interval, speculative, radix)
            check_config(_base_config(cfg, engine), engine_overrides(engine.args))


# flags every replica command spells out, default or not, so a record's server line says what ran
ROLE_FLAGS = ("model_path", "tp_size", "speculative_algorithm", "mamba_track_interval")


def server_args(cfg: RunConfig, engine: EngineSpec) -> list[str]:
    """`engine.serve` flags for a pool (host and port are added per replica). Never the API key: a command line
    is readable by every local user; replicas get it in their environment (harness/replica.py)."""
    return to_argv(engine_config(cfg, engine), always=ROLE_FLAGS)


def server_command(cfg: RunConfig, engine: EngineSpec) -> str:
    """The command line a pool's replicas run, as `--dry-run` shows it."""
    return shlex.join([*(cfg.server_command or DEFAULT_SERVER_COMMAND), *server_args(cfg, engine),
                       "--host", "HOST", "--port", "PORT"])


def engine_from_server_info(info: dict, url: str) -> EngineSpec:
    """The EngineSpec an external server reports in /server_info (SGLang's server-args names)."""
    interval = info.get("mamba_track_interval")
    radix = not info.get("disable_radix_cache", False)
    return EngineSpec(
        interval=int(interval) if interval is not None else None,
        block_size=block_size_of(info),  # DFlash builds may report speculative_dflash_block_size only
        strategy=strategy_of(info) if radix else None,  # either SGLang spelling of the strategy
        tp=int(info.get("tp_size") or 1),
        fault=info.get("inject_fault"),
        speculative=reports_speculation(info),
        radix_cache=radix,
    )


@dataclass(frozen=True)
class PoolPlan:
    """One pool: its name (`i128`, ..., `reference`), engine, replicas and the sessions it serves."""

    name: str
    role: str  # candidate | reference
    engine: EngineSpec
    replicas: int
    sessions: tuple = ()  # workloads Session objects (candidates only)
    endpoints: tuple[str, ...] = ()  # external servers; empty for built-in replicas
    server_infos: tuple[dict, ...] = ()  # their probed /server_info, one per endpoint

    @property
    def requests_per_point(self) -> int:
        return sum(len(s.turns) for s in self.sessions)


@dataclass(frozen=True)
class Plan:
    candidates: tuple[PoolPlan, ...]
    reference: PoolPlan
    concurrency: tuple[int, ...]
    skipped_sessions: int  # sessions whose interval has no pool
    workload: str = ""  # what the sessions were built for (harness/workload.py)
    tokenizer: object = None  # the target's Tokenizer (None: unknown), for the records' text

    @property
    def total_candidate_requests(self) -> int:
        return sum(p.requests_per_point for p in self.candidates) * len(self.concurrency)

    def describe(self, cfg: RunConfig) -> str:
        """The human-readable plan `--dry-run` prints."""
        lines = [f"suite {cfg.workload}: {sum(len(p.sessions) for p in self.candidates)} session runs per sweep "
                 f"point over {len(self.candidates)} candidate pool(s)"
                 + (f"; {self.skipped_sessions} session(s) target an interval with no pool" if
                    self.skipped_sessions else "")]
        if self.workload:
            lines.append(self.workload)
        where = "external endpoints" if cfg.external else (
            f"Ray ({cfg.address or 'auto on a ray-up node, else a local Ray'}), one placement group per "
            f"replica: {cfg.tp_size} bundle(s) of {{'CPU': 1}}, strategy {cfg.placement}, replicas spread "
            "over nodes")
        lines.append(f"placement: {where}")
        if not cfg.external:
            key = "--api-key" if cfg.api_key else "a random key drawn for this run"
            lines.append(f"access: replicas require an API key ({key}, passed in their environment, never on a "
                         "command line) and listen on 127.0.0.1 on a single-node Ray, on their node's address "
                         "on a multi-node cluster")
        for p in (*self.candidates, self.reference):
            e = p.engine
            if p.role == "reference":
                what = "cold path: no speculation, no radix cache"
            else:
                what = ", ".join([f"DFLASH B={e.block_size}" if e.speculative else "no speculation",
                                  f"radix {e.strategy}" if e.radix_cache else "no radix cache",
                                  f"interval {e.interval}"])
            if e.fault:
                what += f", fault {e.fault}"
            if e.args:
                what += f", engine args {' '.join(e.args)}"
            lines.append(f"pool {p.name}: {p.replicas} replica(s), tp {e.tp}, {what}")
            if p.endpoints:
                lines.append("  endpoints: " + ", ".join(p.endpoints))
                lines += probe_lines(p.server_infos)
            if not cfg.external:
                lines.append("  server: " + server_command(cfg, e))
        for p in self.candidates:
            lines.append(f"pool {p.name}: {len(p.sessions)} sessions, {p.requests_per_point} requests per "
                         f"sweep point, concurrency {','.join(map(str, self.concurrency))}")
        n = self.total_candidate_requests
        lines.append(f"total: {n} candidate requests; reference requests <= {n} (identical inputs served once)")
        return "\n".join(lines)


def sessions_for(sessions: list, interval: int) -> tuple:
    """The sessions a pool of `interval` serves: those targeting it and those targeting any interval."""
    return tuple(s for s in sessions if s.interval is None or s.interval == interval)


def skipped(sessions: list, intervals: set[int]) -> int:
    return sum(1 for s in sessions if s.interval is not None and s.interval not in intervals)


def builtin_plan(cfg: RunConfig, sessions: list) -> Plan:
    """Pools of built-in replicas: one candidate pool per interval (with --diagnose also `i<I>-spec` and
    `i<I>-cache`) and one reference pool."""
    cands = []
    for i in cfg.intervals:
        variants = {"": (True, True), **(DIAGNOSE_VARIANTS if cfg.diagnose else {})}
        for suffix, (speculative, radix) in variants.items():
            engine = candidate_engine(cfg, i, speculative, radix)
            name = f"i{i}" + (f"-{suffix}" if suffix else "")
            cands.append(PoolPlan(name, "candidate", engine, cfg.replicas, sessions_for(sessions, i)))
    cands = tuple(cands)
    ref = PoolPlan(REFERENCE_POOL, "reference", reference_engine(cfg), cfg.reference_replicas)
    return Plan(cands, ref, cfg.concurrency, skipped(sessions, set(cfg.intervals)))


def external_plan(cfg: RunConfig, sessions: list, infos: dict[str, dict]) -> Plan:
    """Pools of external servers, grouped by the interval each reports; `infos` maps URL -> /server_info.

    Raises ValueError naming the endpoint when its settings do not fit its role.
    """
    by_interval: dict[int, list[tuple[str, EngineSpec]]] = {}
    for url in cfg.endpoint:
        e = engine_from_server_info(infos[url], url)
        if e.interval is None:
            raise ValueError(f"endpoint {url}: /server_info has no mamba_track_interval; specgate needs a "
                             "hybrid model served with a mamba radix cache")
        if not e.speculative or not e.radix_cache:
            raise ValueError(f"endpoint {url}: a candidate must run speculative decoding with the radix cache "
                             f"(speculative_algorithm={infos[url].get('speculative_algorithm')}, "
                             f"disable_radix_cache={infos[url].get('disable_radix_cache')})")
        by_interval.setdefault(e.interval, []).append((url, e))
    cands = []
    for interval, members in sorted(by_interval.items()):
        blocks = {e.block_size for _, e in members}
        if len(blocks) > 1:
            raise ValueError(f"endpoints with interval {interval} disagree on the block size: {sorted(blocks)}")
        urls = tuple(u for u, _ in members)
        cands.append(PoolPlan(f"i{interval}", "candidate", members[0][1], len(urls),
                              sessions_for(sessions, interval), urls, tuple(infos[u] for u in urls)))
    ref_infos = [engine_from_server_info(infos[u], u) for u in cfg.reference_endpoint]
    for url, e in zip(cfg.reference_endpoint, ref_infos, strict=True):
        if e.speculative or e.radix_cache:
            raise ValueError(f"reference endpoint {url}: the oracle must run without speculation and with "
                             "--disable-radix-cache")
    ref = PoolPlan(REFERENCE_POOL, "reference", ref_infos[0], len(cfg.reference_endpoint),
                   endpoints=cfg.reference_endpoint, server_infos=tuple(infos[u] for u in cfg.reference_endpoint))
    return Plan(tuple(cands), ref, cfg.concurrency, skipped(sessions, set(by_interval)))
