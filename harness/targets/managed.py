"""Targets whose servers the harness starts itself, under Ray: one replica actor per replica (harness/replica.py)
runs the command `launch(pool, devices)` gives, in the environment its `environment` function makes, inside the
placement group the target says it needs: one bundle per TP rank where the harness starts the ranks (`own_ranks`
False: the built-in engine's rank actors), else one bundle with every rank's GPUs for a server that starts its own
TP workers (harness/placement.py)."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from harness.config import TargetSettings
from harness.nodes import local_gpus
from harness.placement import Devices, dry_run_devices, engine_bundles, rank_bundles
from harness.plan import Plan, PoolPlan
from harness.ray_pools import Launch, RayPools
from harness.settings import Need, setting
from harness.targets.base import Target

__all__ = ["Devices", "Launch", "ManagedSettings", "ManagedTarget", "diagnose_setting"]

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

    # whether several replicas may share a GPU (--gpus-per-rank below 1): a server that starts its own TP workers
    # wants them whole
    gpu_fractions: ClassVar[bool] = False

    def validate(self, run: RunConfig, need: Need) -> None:
        """Each interval holds at least one verify block (the servers' checkpoints are every interval tokens), and a
        fraction of a GPU per rank only where replicas can share one, and never between the ranks of one replica."""
        super().validate(run, need)
        for i in run.intervals:
            need(i >= run.block_size, f"--intervals: interval {i} is smaller than --block-size {run.block_size} "
                 "(one verify step may cross at most one boundary)")
        g = run.gpus_per_rank
        if g is not None and g != int(g):
            need(self.gpu_fractions, f"--gpus-per-rank {g:g}: --engine {self.key} starts its own tensor-parallel "
                 "workers on whole GPUs; give a whole number (built-in replicas can share a GPU)")
            need(run.tp_size == 1, f"--gpus-per-rank {g:g} with --tp-size {run.tp_size}: the ranks of one replica "
                 "would share a GPU, which NCCL refuses; share GPUs between replicas of --tp-size 1")


def diagnose_setting():
    """--diagnose, for the targets that offer it (one declaration, so its flag and help are the same for each)."""
    return setting(False, "bool", "differential diagnosis: add a speculation-only (radix off) and a cache-only "
                   "(no speculation) pool per interval beside the full candidate", resume="fixed")


class ManagedTarget(Target):
    """A target started under Ray; a subclass says what each pool's replicas run and how they are spoken to."""

    managed = True
    # its server starts its own tensor-parallel workers (one bundle holds all of a replica's GPUs); False: the
    # harness starts one rank actor per TP rank, each in a bundle of its own
    own_ranks: ClassVar[bool] = True
    devices: Devices | None = None  # where the started replicas compute, once `servers` resolved it

    @abstractmethod
    def launch(self, pool: PoolPlan, devices: Devices) -> Launch:
        """The command, flags and environment of `pool`'s replicas on `devices` (the profile their placement
        chooses); InterpreterNotFound: no engine venv; HarnessError: the pool cannot run there."""

    def node_paths(self, pool: PoolPlan) -> tuple[tuple[str, str], ...]:
        """(directory, the flag that named it) that `pool`'s servers read and every node hosting one must have."""
        return ()

    def placed(self, pool: PoolPlan, devices: Devices) -> Launch:
        """`launch`, with the bundles a replica reserves and the directories checked on its node."""
        bundles = (engine_bundles if self.own_ranks else rank_bundles)(self.cfg.tp_size, devices)
        return replace(self.launch(pool, devices), bundles=bundles, paths=self.node_paths(pool))

    def dry_run_devices(self) -> list[Devices]:
        """The devices `--dry-run` shows pools on (it joins no cluster): --device's; for auto, this machine's where
        the run would start a local Ray, else both."""
        return dry_run_devices(self.cfg.device, self.cfg.gpus_per_rank, None if self.cfg.address else local_gpus())

    def placement_text(self) -> str:
        """`--dry-run`'s words on where the replicas go and what each reserves."""
        cfg = self.cfg
        shapes = "; ".join(f"on {'GPUs' if d.on_gpu else 'CPU'}: {d.describe(cfg.tp_size, self.own_ranks)}"
                           for d in self.dry_run_devices())
        where = ("the Ray cluster this node runs (--address auto)" if cfg.address == "auto" else
                 f"the Ray cluster at {cfg.address}" if cfg.address else
                 "a local Ray of its own (--address auto joins the cluster this node runs)")
        return (f"{where}; one placement group per replica, strategy {cfg.placement}, replicas spread over nodes; "
                f"--device {cfg.device}" + (" (cuda where the cluster has GPUs)" if cfg.device == "auto" else "")
                + f"; {shapes}")

    @abstractmethod
    def backend(self, api_key: str) -> Backend:
        """How the harness speaks to the started servers, which require `api_key`."""

    def log_dir(self, run_dir: Path) -> str | None:
        """Where the servers write their logs (None: a temporary directory of each node)."""
        return None

    @contextmanager
    def servers(self, plan: Plan, run_dir: Path, run_id: str) -> Iterator[tuple[list[Pool], Pool]]:
        """Connect to (or start) Ray, start every replica, wait until all are healthy; stop them after."""
        pools = RayPools(self.cfg, plan, run_id, self.placed, log_dir=self.log_dir(run_dir))
        pools.backend = self.backend(pools.api_key)
        try:
            pools.connect()
            started = pools.start()
            self.devices = pools.devices  # what the run resolved (settle's notes read it)
            yield started
        finally:
            pools.close()
