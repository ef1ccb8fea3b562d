"""Targets whose servers the harness starts itself, under Ray: one replica actor per replica (harness/replica.py)
runs the command `launch(pool)` gives, in the environment its `environment` function makes."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harness.plan import REFERENCE_POOL, Plan, PoolPlan
from harness.ray_pools import RayPools
from harness.targets.base import Target
from harness.targets.venv import InterpreterNotFound, Venv, find_python
from harness.workload import WorkloadTarget, from_flags

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


class ProfileTarget(ManagedTarget):
    """A real engine's target (vLLM, SGLang): its pools come from its profile module (the flags each pool's servers
    get), each candidate serves every session (its interval is what its servers report, known once they are up),
    and its interpreter lives in a venv of its own."""

    venv: Venv

    @abstractmethod
    def python_flag(self) -> str | None:
        """The interpreter the user gave (--vllm-python / --sglang-python), None for the venv's default."""

    @abstractmethod
    def profile_pools(self) -> tuple[list, object]:
        """(candidate pools, reference pool) of the profile, from the flags."""

    @abstractmethod
    def engine_spec(self, pool) -> object:
        """The EngineSpec of one profile pool."""

    @abstractmethod
    def describe_pools(self, python: str, cands: list, ref, n_sessions: int) -> str:
        """The profile's --dry-run text of its pools and their commands."""

    def workload(self, infos: dict[str, dict]) -> WorkloadTarget:
        """The flags' intervals and B, in --tokenizer or the --model directory's tokenizer."""
        cfg = self.cfg
        if cfg.tokenizer:
            return from_flags(cfg, cfg.tokenizer, "--tokenizer")
        if (Path(cfg.model_path).expanduser() / "tokenizer.json").exists():
            return from_flags(cfg, cfg.model_path, f"--model (the {self.venv.engine} model directory)")
        return from_flags(cfg, None, f"--model {cfg.model_path} holds no tokenizer.json")

    def plan(self, sessions: list, infos: dict[str, dict]) -> Plan:
        """Pools from the flags (the profile's `pools`); each candidate serves every session."""
        cfg = self.cfg
        cands, ref = self.profile_pools()
        plans = tuple(PoolPlan(p.name, "candidate", self.engine_spec(p), cfg.replicas, tuple(sessions)) for p in cands)
        return Plan(plans, PoolPlan(REFERENCE_POOL, "reference", self.engine_spec(ref), cfg.reference_replicas),
                    cfg.concurrency, 0)

    def describe(self, plan: Plan) -> str:
        """Pools, commands, environment, and what is read from the servers (nothing is started)."""
        try:
            python = find_python(self.venv, self.python_flag())
        except InterpreterNotFound as e:
            python = f"<no {self.venv.engine} interpreter: {e}>"
        cands, ref = self.profile_pools()
        n_sessions = len(plan.candidates[0].sessions) if plan.candidates else 0
        text = self.describe_pools(python, cands, ref, n_sessions)
        return text + (f"\n{plan.workload}" if plan.workload else "")
