"""Targets whose servers the harness starts itself, under Ray: one replica actor per replica (harness/replica.py)
runs the command `launch(pool)` gives, in the environment its `environment` function makes."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harness.plan import Plan, PoolPlan
from harness.ray_pools import RayPools
from harness.targets.base import Target

if TYPE_CHECKING:
    from harness.backends import Backend
    from harness.pools import Pool
    from harness.replica import ServerSite


@dataclass(frozen=True)
class Launch:
    """What a pool's replica actors run.

    `command`: the server command (None: `python -m engine.serve`, a leading `python` being the node's project
    interpreter); `args`: its flags, host and port added per replica; `engine_cfg`: the built-in engine's
    EngineConfig as a dict (its tensor-parallel rank actors are built from it; None for other engines);
    `environment`: a module-level function (it travels to the actor by reference) that turns the inherited
    environment into the server's, given where it runs (None: the project's own, harness/replica.py).
    """

    command: tuple[str, ...] | None
    args: tuple[str, ...]
    engine_cfg: dict | None = None
    environment: Callable[[dict, ServerSite], dict] | None = None


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
