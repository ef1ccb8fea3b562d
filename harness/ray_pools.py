"""Replicas on Ray: one placement group per replica (`tp_size` bundles, bundle 0 = rank 0 and its
server), replicas spread round-robin over the cluster's nodes, Ray restarting a replica whose
server dies (harness/replica.py) at most `--max-replica-restarts` times. What each pool's
replicas run comes from its target (`launch`, harness/targets/managed.py).

Replicas are not open to the network: they require a per-run random API key (unless `--api-key`
gives one), which reaches them through Ray and their environment, never a command line; and they
listen on 127.0.0.1 when the Ray cluster is this one node, on their node's address only on a
multi-node cluster.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.errors import HarnessError
from harness.plan import Plan, PoolPlan
from harness.pools import Pool, Replica
from harness.progress import wait_all

if TYPE_CHECKING:
    from harness.config import RunConfig
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


def resolve_address(address: str | None) -> str | None:
    """The Ray address to join: only the one given (--address, else RAY_ADDRESS); None starts a local Ray.

    Never found by itself: a `ray start` address file in the default temp directory may be another user's
    cluster, so a cluster of this machine is joined with `--address auto` only."""
    return address or None


def replica_bundles(tp_size: int) -> list[dict]:
    """Placement-group bundles of one replica: one per TP rank. Bundle 0 hosts the replica actor
    (rank 0 and the server); rank actors of a tensor-parallel replica go in bundles 1..tp_size-1."""
    return [{"CPU": 1} for _ in range(tp_size)]


def _startup_excerpt(err: BaseException) -> str:
    """A failed start, short: which replica, and the first lines of its server's error (not Ray's whole trace)."""
    from harness.replica import crash_excerpt

    text = str(err)
    heads = re.findall(r"replica [\w.-]+: server did not become healthy[^\n]*", text)
    head = heads[-1] if heads else ""
    rest = text[text.find(head) + len(head):] if head else text
    return (head + "\n" if head else "") + (crash_excerpt(rest) or text)[:3000]


class RayPools:
    """Replicas on Ray: connect (or start a local Ray), place, start, and tear down."""

    def __init__(self, cfg: RunConfig, plan: Plan, run_id: str, launch: Callable[[PoolPlan], Launch],
                 log_dir: str | None = None, backend=None) -> None:
        """`launch`: what a pool's replicas run (the target's); `log_dir`: where replicas write their logs
        (default a temporary directory of each node); `backend`: how the pools are spoken to (default SGLang's
        API, the built-in engine's)."""
        self.cfg, self.plan, self.run_id, self.launch = cfg, plan, run_id, launch
        self.log_dir, self.backend = log_dir, backend
        self.started_ray = False
        self.temp_dir: str | None = None  # a local Ray's own temp directory, removed with it
        self.actors: list = []
        self.groups: list = []
        self.api_key = cfg.api_key or secrets.token_urlsafe(32)  # what the driver sends to this run's replicas

    def local_cpus(self) -> int:
        """Logical CPUs for a local Ray: every replica bundle fits, even on a 2-core laptop (Ray's CPUs
        are logical; the replicas then share the real cores)."""
        replicas = sum(p.replicas for p in (*self.plan.candidates, self.plan.reference))
        return max(os.cpu_count() or 1, replicas * self.cfg.tp_size + 1)

    def connect(self) -> None:
        """Join the cluster `--address` names, else start a local Ray in a temporary directory of its own (a
        `ray start` elsewhere on this machine is never joined). SIGTERM keeps the harness's handler."""
        import ray

        if ray.is_initialized():
            return  # an embedding program (or a test) already connected
        address = resolve_address(self.cfg.address)
        previous = signal.getsignal(signal.SIGTERM)  # ray.init replaces it with one that aborts the run
        try:
            if address:
                print(f"connecting to the Ray cluster at {address}")
                ray.init(address=address, include_dashboard=False, log_to_driver=False)
            else:
                print("starting a local Ray (no --address / RAY_ADDRESS)")
                # a short path: Ray's socket names under it must fit the 107-byte limit of a Unix socket
                self.temp_dir = tempfile.mkdtemp(prefix="specgate-ray-", dir="/tmp" if os.name == "posix" else None)
                ray.init(address="local", _temp_dir=self.temp_dir, num_cpus=self.cfg.num_cpus or self.local_cpus(),
                         include_dashboard=False, log_to_driver=False)
        finally:
            if previous is not None and threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, previous)
        self.started_ray = True

    def bind(self) -> str:
        """"loopback" when every alive node of the cluster is this machine, else "node" (the node's address)."""
        import ray

        here = ray.util.get_node_ip_address()
        alive = [n for n in ray.nodes() if n.get("Alive")]
        return "loopback" if alive and all(n.get("NodeManagerAddress") == here for n in alive) else "node"

    def start(self) -> tuple[list[Pool], Pool]:
        """Create every replica (placement group + actor) and wait until all are healthy."""
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from harness.replica import ReplicaServer

        actor_cls = ray.remote(max_restarts=self.cfg.max_replica_restarts, max_task_retries=0,
                               num_cpus=1)(ReplicaServer)
        nodes = sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive") and n["Resources"].get("CPU", 0) >= 1)
        bind = self.bind()
        print(f"replicas listen on {'127.0.0.1 (single-node Ray)' if bind == 'loopback' else 'their node address'}"
              f", API key {'from --api-key' if self.cfg.api_key else 'drawn for this run'}")
        log_dir = self.log_dir or os.path.join(tempfile.gettempdir(), "specgate", self.run_id)
        specs = []
        for p in (*self.plan.candidates, self.plan.reference):
            launch = self.launch(p)
            for r in range(p.replicas):
                bundles = replica_bundles(self.cfg.tp_size)
                kwargs = {}
                if self.cfg.placement == "STRICT_PACK" and nodes:
                    kwargs["_soft_target_node_id"] = nodes[len(specs) % len(nodes)]  # spread replicas
                pg = placement_group(bundles, strategy=self.cfg.placement, **kwargs)
                self.groups.append(pg)
                specs.append((p, f"{p.name}-r{r}", launch, pg))
        try:
            ray.get([spec[3].ready() for spec in specs], timeout=min(self.cfg.startup_timeout, 120))
        except ray.exceptions.GetTimeoutError:
            need = len(specs) * self.cfg.tp_size
            raise HarnessError(f"placement groups not ready: {len(specs)} replica(s) need {need} CPU(s) "
                               f"({self.cfg.tp_size} per replica); the cluster has "
                               f"{ray.cluster_resources().get('CPU', 0):g}") from None
        for p, rid, launch, pg in specs:
            strategy = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0)
            actor = actor_cls.options(scheduling_strategy=strategy).remote(
                rid, list(launch.args), launch.command, os.getcwd(), self.cfg.startup_timeout, log_dir,
                launch.engine_cfg, self.api_key, bind, self.cfg.recover_timeout, launch.environment,
                self.cfg.reference_nice if p.role == "reference" else 0)
            self.actors.append(actor)
        try:
            infos = wait_all([a.info.remote() for a in self.actors], self.cfg.startup_timeout + 30, "replicas")
        except ray.exceptions.GetTimeoutError:
            raise HarnessError(f"replicas not healthy within {self.cfg.startup_timeout:g}s") from None
        except ray.exceptions.RayActorError as e:
            raise HarnessError(f"a replica failed to start: {_startup_excerpt(e)}") from None
        pools: dict[str, Pool] = {}
        for (p, rid, *_), actor, info in zip(specs, self.actors, infos, strict=True):
            pool = pools.get(p.name)
            if pool is None:
                pool = pools[p.name] = Pool(p.name, p.role, p.engine, [], False, self.cfg.recover_timeout,
                                            self.api_key, self.backend)
            pool.replicas.append(Replica(rid, info["url"], info["node_id"], actor, log=info["log"]))
        cands = [pools[p.name] for p in self.plan.candidates]
        return cands, pools[self.plan.reference.name]

    def close(self) -> None:
        """Stop servers, kill actors, remove placement groups; shut down a Ray we started."""
        import ray

        if not ray.is_initialized():
            return
        try:
            ray.get([a.stop.remote() for a in self.actors], timeout=30)
        except Exception:  # noqa: BLE001 - a dead actor's server is gone already
            pass
        for a in self.actors:
            ray.kill(a, no_restart=True)
        from ray.util.placement_group import remove_placement_group

        for pg in self.groups:
            try:
                remove_placement_group(pg)
            except Exception:  # noqa: BLE001
                pass
        if self.started_ray:
            handler = signal.getsignal(signal.SIGTERM)
            ray.shutdown()
            if callable(handler) and threading.current_thread() is threading.main_thread():
                # Ray's core worker leaves SIGTERM at the OS default when it shuts down, behind Python's back
                signal.signal(signal.SIGTERM, handler)
            if self.temp_dir:
                shutil.rmtree(self.temp_dir, ignore_errors=True)
