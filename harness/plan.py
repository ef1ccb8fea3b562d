"""The run plan: which pools exist, what their servers run, which sessions each pool serves.

The plan's types, whatever the target; each target (harness/targets/) builds its
plan from the RunConfig and the workload (plus, for external endpoints, their
/server_info) with pure functions, so `--dry-run` prints exactly what a run would do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.backends.info import probe_lines

if TYPE_CHECKING:
    from harness.config import RunConfig

REFERENCE_POOL = "reference"


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

    def describe(self, cfg: RunConfig, server_lines: Callable[[EngineSpec], list[str]] | None = None,
                 placement: str = "external endpoints") -> str:
        """The human-readable plan `--dry-run` prints; for targets that start their servers, `server_lines`: the
        lines saying a pool's servers' command (one per device they may run on: `server: CMD`, `server on GPUs:
        CMD`), and `placement`: where they go."""
        lines = [f"suite {cfg.workload}: {sum(len(p.sessions) for p in self.candidates)} session runs per sweep "
                 f"point over {len(self.candidates)} candidate pool(s)"
                 + (f"; {self.skipped_sessions} session(s) target an interval with no pool" if
                    self.skipped_sessions else "")]
        if self.workload:
            lines.append(self.workload)
        lines.append(f"placement: {placement}")
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
            if server_lines is not None:
                lines += ["  " + line for line in server_lines(e)]
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
