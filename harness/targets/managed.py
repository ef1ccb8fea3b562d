"""Targets whose servers the harness starts itself, under Ray: one replica actor per replica (harness/replica.py)
runs the command `launch(pool)` gives, in the environment its `environment` function makes."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harness.config import TargetSettings
from harness.plan import Plan, PoolPlan
from harness.ray_pools import Launch, RayPools
from harness.settings import Need, setting
from harness.targets.base import Target

__all__ = ["Launch", "ManagedSettings", "ManagedTarget", "diagnose_setting"]

if TYPE_CHECKING:
    from harness.backends import Backend
    from harness.config import RunConfig
    from harness.pools import Pool


@dataclass(frozen=True)
class ManagedSettings(TargetSettings):
    """What every target the harness starts has: a model, the candidates' own flags, a server command."""

    model_path: str = setting("default", "str", "default (bundled weights), random, or a weights directory "
                              "(--model DIR: with --engine vllm or sglang, one from `python -m harness.models "
                              "build`)", resume="runs")
    candidate_args: tuple[str, ...] = setting((), "args", "engine flags for the candidate replicas only: "
                                              "engine.serve's, e.g. '--max-state-slots 12'; with --engine vllm, "
                                              "vLLM's, e.g. '--enable-prefix-caching --speculative-config JSON'; "
                                              "with --engine sglang, SGLang's", resume="runs")
    server_command: tuple[str, ...] | None = setting(
        None, "cmd", "replica server command (default: the target's own, e.g. 'python -m engine.serve'; a leading "
        "python is the replica's interpreter)", resume="runs")

    def validate(self, run: RunConfig, need: Need) -> None:
        """Each interval holds at least one verify block (the servers' checkpoints are every interval tokens)."""
        super().validate(run, need)
        for i in run.intervals:
            need(i >= run.block_size, f"--intervals: interval {i} is smaller than --block-size {run.block_size} "
                 "(one verify step may cross at most one boundary)")


def diagnose_setting():
    """--diagnose, for the targets that offer it (one declaration, so its flag and help are the same for each)."""
    return setting(False, "bool", "differential diagnosis: add a speculation-only (radix off) and a cache-only "
                   "(no speculation) pool per interval beside the full candidate", resume="fixed")


class ManagedTarget(Target):
    """A target started under Ray; a subclass says what each pool's replicas run and how they are spoken to."""

    managed = True

    @abstractmethod
    def launch(self, pool: PoolPlan) -> Launch:
        """The command, flags and environment of `pool`'s replicas (InterpreterNotFound: no engine venv)."""

    @abstractmethod
    def backend(self, api_key: str) -> Backend:
        """How the harness speaks to the started servers, which require `api_key`."""

    def log_dir(self, run_dir: Path) -> str | None:
        """Where the servers write their logs (None: a temporary directory of each node)."""
        return None

    @contextmanager
    def servers(self, plan: Plan, run_dir: Path, run_id: str) -> Iterator[tuple[list[Pool], Pool]]:
        """Connect to (or start) Ray, start every replica, wait until all are healthy; stop them after."""
        pools = RayPools(self.cfg, plan, run_id, self.launch, log_dir=self.log_dir(run_dir))
        pools.backend = self.backend(pools.api_key)
        try:
            pools.connect()
            yield pools.start()
        finally:
            pools.close()
