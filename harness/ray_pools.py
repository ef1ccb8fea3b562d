"""Replicas on Ray: one placement group per replica (its bundles and what each reserves: harness/placement.py),
replicas spread round-robin over the cluster's nodes, Ray restarting a replica whose server dies
(harness/replica.py) at most `--max-replica-restarts` times. What each pool's replicas run comes from its target
(`launch`, harness/targets/managed.py), given the device the run resolved (`--device`, `--gpus-per-rank`).

Before anything starts, the plan is checked against the cluster (a plan that does not fit is refused, naming both)
and, once the placement groups are ready, the directories each replica's server reads are checked on its node.
What every replica got (node, GPU ids, CUDA_VISIBLE_DEVICES, device) is printed and kept with the pools.

Replicas are not open to the network: they require a per-run random API key (unless `--api-key`
gives one), which reaches them through Ray and their environment, never a command line; and they
listen on 127.0.0.1 when the Ray cluster is this one node, on their node's address only on a
multi-node cluster.
"""

from __future__ import annotations

import logging
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
from harness.nodes import alive_nodes, check_paths, group_node
from harness.placement import Demand, Devices, misfit, resolve_devices
from harness.plan import Plan, PoolPlan
from harness.pools import Pool, Replica
from harness.ports import shared_addresses
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
    environment into the server's, given where it runs (None: the project's own, harness/replica.py);
    `bundles`: the replica's placement-group bundles (harness/placement.py; bundle 0 is the replica actor's, the
    others its rank actors'); `paths`: (directory, the flag that named it) the server reads, checked on its node.
    """

    command: tuple[str, ...] | None
    args: tuple[str, ...]
    engine_cfg: dict | None = None
    environment: Callable[[dict, ServerSite], dict] | None = None
    bundles: tuple[dict, ...] = ({"CPU": 1},)
    paths: tuple[tuple[str, str], ...] = ()


def resolve_address(address: str | None) -> str | None:
    """The Ray address to join: only the one given (--address, else RAY_ADDRESS); None starts a local Ray.

    Never found by itself: a `ray start` address file in the default temp directory may be another user's
    cluster, so a cluster of this machine is joined with `--address auto` only."""
    return address or None


def _startup_excerpt(err: BaseException) -> str:
    """A failed start, short: which replica, and the first lines of its server's error (not Ray's whole trace)."""
    from harness.replica import crash_excerpt

    text = str(err)
    heads = re.findall(r"replica [\w.-]+: server did not become healthy[^\n]*", text)
    head = heads[-1] if heads else ""
    rest = text[text.find(head) + len(head):] if head else text
    return (head + "\n" if head else "") + (crash_excerpt(rest) or text)[:3000]


def placement_line(replica_id: str, seat: dict) -> str:
    """One replica's placement, for the log: node, GPU ids, CUDA_VISIBLE_DEVICES, device (and its rank actors')."""
    def one(s: dict) -> str:
        gpus = ",".join(s.get("gpu_ids") or []) or "none"
        return (f"node {s.get('node_ip')} ({str(s.get('node_id'))[:8]}), GPUs {gpus}, CUDA_VISIBLE_DEVICES="
                f"{s.get('cuda_visible_devices', '')!r}, {s.get('device')}")

    ranks = "".join(f"; rank {r.get('rank')}: {one(r)}" for r in seat.get("ranks", []))
    return f"replica {replica_id}: {one(seat)}{ranks}"


class RayPools:
    """Replicas on Ray: connect (or start a local Ray), place, start, and tear down."""

    def __init__(self, cfg: RunConfig, plan: Plan, run_id: str, launch: Callable[[PoolPlan, Devices], Launch],
                 log_dir: str | None = None, backend=None) -> None:
        """`launch`: what a pool's replicas run and reserve on the resolved devices (the target's); `log_dir`:
        where replicas write their logs (default a temporary directory of each node); `backend`: how the pools
        are spoken to (default SGLang's API, the built-in engine's)."""
        self.cfg, self.plan, self.run_id, self.launch = cfg, plan, run_id, launch
        self.log_dir, self.backend = log_dir, backend
        self.started_ray = False
        self.temp_dir: str | None = None  # a local Ray's own temp directory, removed with it
        self.actors: list = []
        self.groups: list = []
        self.devices: Devices | None = None  # resolved against the cluster in start()
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
                # Ray turns token authentication on for a new local cluster, the safe default, and warns that it
                # did on every run; the harness keeps the default and drops the warning
                logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
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
        """Check the plan against the cluster, create every replica (placement group + actor), check the
        directories its server reads on its node, and wait until all are healthy."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from harness.replica import ReplicaServer

        self.devices = resolve_devices(self.cfg.device, self.cfg.gpus_per_rank, ray.cluster_resources().get("GPU", 0))
        pools = (*self.plan.candidates, self.plan.reference)
        launches = {p.name: self.launch(p, self.devices) for p in pools}  # a target's refusal comes before any start
        nodes = alive_nodes()
        problem = misfit([Demand(p.name, p.replicas, launches[p.name].bundles) for p in pools],
                         {n.name: n.resources for n in nodes}, self.cfg.placement, self.cfg.tp_size, self.devices)
        if problem:
            raise HarnessError(problem)
        bind = self.bind()
        print(f"replicas listen on {'127.0.0.1 (single-node Ray)' if bind == 'loopback' else 'their node address'}"
              f", API key {'from --api-key' if self.cfg.api_key else 'drawn for this run'}; device "
              f"{self.devices.kind}" + (f", {self.devices.gpus_per_rank:g} GPU(s) per rank" if self.devices.on_gpu
                                        else ""))
        specs = self._place(pools, launches, nodes)
        check_paths([(rid, group_node(pg), launch.paths) for _, rid, launch, pg in specs], nodes)
        log_dir = self.log_dir or os.path.join(tempfile.gettempdir(), "specgate", self.run_id)
        actor_cls = ray.remote(max_restarts=self.cfg.max_replica_restarts, max_task_retries=0,
                               num_cpus=1)(ReplicaServer)
        for p, rid, launch, pg in specs:
            strategy = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0)
            rank_gpus = launch.bundles[-1].get("GPU", 0) if len(launch.bundles) > 1 else 0
            actor = actor_cls.options(scheduling_strategy=strategy, num_gpus=launch.bundles[0].get("GPU", 0)).remote(
                rid, list(launch.args), launch.command, os.getcwd(), self.cfg.startup_timeout, log_dir,
                launch.engine_cfg, self.api_key, bind, self.cfg.recover_timeout, launch.environment,
                self.cfg.reference_nice if p.role == "reference" else 0, rank_gpus)
            self.actors.append(actor)
        try:
            infos = wait_all([a.info.remote() for a in self.actors], self.cfg.startup_timeout + 30, "replicas")
        except ray.exceptions.GetTimeoutError:
            raise HarnessError(f"replicas not healthy within {self.cfg.startup_timeout:g}s") from None
        except ray.exceptions.RayActorError as e:
            raise HarnessError(f"a replica failed to start: {_startup_excerpt(e)}") from None
        return self._pools(specs, infos)

    def _place(self, pools, launches: dict[str, Launch], nodes) -> list[tuple]:
        """One placement group per replica, spread round-robin over the nodes that can hold one; wait until all
        are ready. Returns (pool plan, replica id, launch, group) per replica."""
        import ray
        from ray.util.placement_group import placement_group

        specs = []
        for p in pools:
            launch = launches[p.name]
            need = {k: sum(b.get(k, 0) for b in launch.bundles) for k in ("CPU", "GPU")}
            hosts = [n.node_id for n in nodes if all(n.resources.get(k, 0) >= v for k, v in need.items())]
            for r in range(p.replicas):
                kwargs = {}
                if self.cfg.placement == "STRICT_PACK" and hosts:
                    kwargs["_soft_target_node_id"] = hosts[len(specs) % len(hosts)]  # spread replicas
                pg = placement_group(list(launch.bundles), strategy=self.cfg.placement, **kwargs)
                self.groups.append(pg)
                specs.append((p, f"{p.name}-r{r}", launch, pg))
        try:
            ray.get([spec[3].ready() for spec in specs], timeout=min(self.cfg.startup_timeout, 120))
        except ray.exceptions.GetTimeoutError:
            cluster = ray.cluster_resources()
            need = {k: sum(b.get(k, 0) for *_, launch, _ in specs for b in launch.bundles) for k in ("CPU", "GPU")}
            raise HarnessError(f"placement groups not ready: {len(specs)} replica(s) need {need['CPU']:g} CPU(s) and "
                               f"{need['GPU']:g} GPU(s); the cluster has {cluster.get('CPU', 0):g} CPU(s) and "
                               f"{cluster.get('GPU', 0):g} GPU(s), some of them held by others") from None
        return specs

    def _pools(self, specs: list[tuple], infos: list[dict]) -> tuple[list[Pool], Pool]:
        """The started replicas as pools, each with where it sits (printed, one line per replica)."""
        problem = shared_addresses({rid: info["url"] for (_, rid, *_), info in zip(specs, infos, strict=True)})
        if problem:
            raise HarnessError(problem)
        pools: dict[str, Pool] = {}
        for (p, rid, *_), actor, info in zip(specs, self.actors, infos, strict=True):
            pool = pools.get(p.name)
            if pool is None:
                pool = pools[p.name] = Pool(p.name, p.role, p.engine, [], False, self.cfg.recover_timeout,
                                            self.api_key, self.backend)
            pool.replicas.append(Replica(rid, info["url"], info["node_id"], actor, log=info["log"],
                                         placement=info.get("placement")))
            print(placement_line(rid, info.get("placement") or {}))
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
