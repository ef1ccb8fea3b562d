"""Pools of replicas, as the driver sees them, and their Ray orchestration.

`Pool` is the driver-side view: replicas with a URL and a health flag, session
affinity with fail-over, and recovery of a failed replica (wait for Ray to
restart its actor, then for /health). `RayPools` starts built-in replicas: one
placement group per replica (`tp_size` bundles, bundle 0 = rank 0), replicas
spread round-robin over the cluster's nodes.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field

import aiohttp

from harness import client
from harness.config import RunConfig
from harness.plan import EngineSpec, Plan, PoolPlan, server_args


class HarnessError(RuntimeError):
    """The harness cannot go on (cluster, replicas, endpoints); exit status 2."""


@dataclass
class Replica:
    """One serving replica: where it answers, on which node, and whether it is usable now."""

    replica_id: str
    url: str
    node_id: str | None = None
    actor: object = None  # Ray actor handle; None for an external endpoint
    healthy: bool = True
    dead: bool = False  # recovery gave up
    recovering: asyncio.Task | None = field(default=None, repr=False)


class Pool:
    """A named group of replicas running the same engine settings."""

    def __init__(self, name: str, role: str, engine: EngineSpec, replicas: list[Replica], external: bool,
                 recover_timeout: float, api_key: str | None = None) -> None:
        self.name, self.role, self.engine, self.replicas = name, role, engine, replicas
        self.external = external
        self.recover_timeout = recover_timeout
        self.api_key = api_key
        self.server_info: dict = {}

    def engine_record(self, replica: Replica | None) -> dict:
        return self.engine.record(replica.url if self.external and replica else None)

    def choose(self, preferred: int) -> Replica | None:
        """The preferred replica if healthy, else the next healthy one in ring order (stable fail-over)."""
        n = len(self.replicas)
        for k in range(n):
            r = self.replicas[(preferred + k) % n]
            if r.healthy:
                return r
        return None

    async def acquire(self, preferred: int) -> Replica | None:
        """A healthy replica, waiting for a recovery if all are down; None once every one is dead."""
        while True:
            r = self.choose(preferred)
            if r is not None:
                return r
            if all(r.dead for r in self.replicas):
                return None
            await asyncio.sleep(0.05)

    def mark_failed(self, replica: Replica, url: str, http: aiohttp.ClientSession) -> None:
        """Take `replica` out of rotation after a failure seen at `url` and start its recovery."""
        if replica.url != url or not replica.healthy:
            return  # a late failure of an incarnation already replaced, or recovery under way
        replica.healthy = False
        replica.recovering = asyncio.ensure_future(self._recover(replica, http))

    async def _recover(self, replica: Replica, http: aiohttp.ClientSession) -> None:
        deadline = time.monotonic() + self.recover_timeout
        while time.monotonic() < deadline:
            url, node_id = replica.url, replica.node_id
            if replica.actor is not None:
                try:  # answers once Ray has restarted the actor and its server is healthy
                    info = await asyncio.wait_for(_await_ref(replica.actor.info.remote()), timeout=30)
                    url, node_id = info["url"], info["node_id"]
                except Exception:  # noqa: BLE001 - actor dead/restarting: ask again
                    await asyncio.sleep(0.2)
                    continue
            if await client.health(http, url):
                replica.url, replica.node_id, replica.healthy = url, node_id, True
                return
            await asyncio.sleep(0.2)
        replica.dead = True
        print(f"[specgate] replica {replica.replica_id} did not recover within {self.recover_timeout:g}s",
              file=sys.stderr)

    async def flush(self, http: aiohttp.ClientSession) -> None:
        """Empty the prefix cache of every healthy replica (between sweep points)."""
        for r in self.replicas:
            if r.healthy:
                try:
                    await client.flush_cache(http, r.url, self.api_key)
                except client.ReplicaFailure:
                    self.mark_failed(r, r.url, http)


async def _await_ref(ref):
    return await ref


def external_pools(plan: Plan, api_key: str | None, recover_timeout: float) -> tuple[list[Pool], Pool]:
    """Pools over already-running servers (no Ray)."""
    def make(p: PoolPlan) -> Pool:
        reps = [Replica(f"{p.name}-r{k}", url) for k, url in enumerate(p.endpoints)]
        return Pool(p.name, p.role, p.engine, reps, True, recover_timeout, api_key)

    return [make(p) for p in plan.candidates], make(plan.reference)


def resolve_address(address: str | None) -> str | None:
    """The Ray address to join: the given one, else `auto` on a node of a running `ray start` cluster."""
    if address:
        return address
    try:
        from ray._private.services import find_bootstrap_address, find_gcs_addresses

        current = find_bootstrap_address(None)
        if current and current in find_gcs_addresses():
            return "auto"
    except Exception:  # noqa: BLE001 - private API moved: fall back to a local Ray
        pass
    return None


def replica_bundles(tp_size: int) -> list[dict]:
    """Placement-group bundles of one replica: one per TP rank. Bundle 0 hosts the replica actor
    (rank 0 and the server); rank actors of a tensor-parallel replica go in bundles 1..tp_size-1."""
    return [{"CPU": 1} for _ in range(tp_size)]


class RayPools:
    """Built-in replicas on Ray: connect (or start a local Ray), place, start, and tear down."""

    def __init__(self, cfg: RunConfig, plan: Plan, run_id: str) -> None:
        self.cfg, self.plan, self.run_id = cfg, plan, run_id
        self.started_ray = False
        self.actors: list = []
        self.groups: list = []

    def local_cpus(self) -> int:
        """Logical CPUs for a local Ray: every replica bundle fits, even on a 2-core laptop (Ray's CPUs
        are logical; the replicas then share the real cores)."""
        replicas = sum(p.replicas for p in (*self.plan.candidates, self.plan.reference))
        return max(os.cpu_count() or 1, replicas * self.cfg.tp_size + 1)

    def connect(self) -> None:
        import ray

        if ray.is_initialized():
            return  # an embedding program (or a test) already connected
        address = resolve_address(self.cfg.address)
        if address:
            print(f"connecting to the Ray cluster at {address}")
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        else:
            print("starting a local Ray (no --address / RAY_ADDRESS)")
            ray.init(num_cpus=self.cfg.num_cpus or self.local_cpus(), include_dashboard=False, log_to_driver=False)
        self.started_ray = True

    def start(self) -> tuple[list[Pool], Pool]:
        """Create every replica (placement group + actor) and wait until all are healthy."""
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from harness.replica import ReplicaServer

        actor_cls = ray.remote(max_restarts=-1, max_task_retries=0, num_cpus=1)(ReplicaServer)
        nodes = sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive") and n["Resources"].get("CPU", 0) >= 1)
        log_dir = os.path.join(tempfile.gettempdir(), "specgate", self.run_id)
        specs = []
        for p in (*self.plan.candidates, self.plan.reference):
            args = server_args(self.cfg, p.engine)
            for r in range(p.replicas):
                bundles = replica_bundles(self.cfg.tp_size)
                kwargs = {}
                if self.cfg.placement == "STRICT_PACK" and nodes:
                    kwargs["_soft_target_node_id"] = nodes[len(specs) % len(nodes)]  # spread replicas
                pg = placement_group(bundles, strategy=self.cfg.placement, **kwargs)
                self.groups.append(pg)
                specs.append((p, f"{p.name}-r{r}", args, pg))
        try:
            ray.get([pg.ready() for _, _, _, pg in specs], timeout=min(self.cfg.startup_timeout, 120))
        except ray.exceptions.GetTimeoutError:
            need = len(specs) * self.cfg.tp_size
            raise HarnessError(f"placement groups not ready: {len(specs)} replica(s) need {need} CPU(s) "
                               f"({self.cfg.tp_size} per replica); the cluster has "
                               f"{ray.cluster_resources().get('CPU', 0):g}") from None
        for _, rid, args, pg in specs:
            strategy = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0)
            actor = actor_cls.options(scheduling_strategy=strategy).remote(
                rid, args, self.cfg.server_command, os.getcwd(), self.cfg.startup_timeout, log_dir)
            self.actors.append(actor)
        try:
            infos = ray.get([a.info.remote() for a in self.actors], timeout=self.cfg.startup_timeout + 30)
        except ray.exceptions.GetTimeoutError:
            raise HarnessError(f"replicas not healthy within {self.cfg.startup_timeout:g}s") from None
        except ray.exceptions.RayActorError as e:
            raise HarnessError(f"a replica failed to start: {e}") from None
        pools: dict[str, Pool] = {}
        for (p, rid, _, _), actor, info in zip(specs, self.actors, infos, strict=True):
            pool = pools.get(p.name)
            if pool is None:
                pool = pools[p.name] = Pool(p.name, p.role, p.engine, [], False, self.cfg.startup_timeout,
                                            self.cfg.api_key)
            pool.replicas.append(Replica(rid, info["url"], info["node_id"], actor))
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
            ray.shutdown()
