"""Pools of replicas as the driver sees them.

`Pool` is the driver-side view: replicas with a URL and a health flag, session
affinity with fail-over, and recovery of a failed replica: Ray restarts its actor
(at most `--max-replica-restarts` times), which starts a new server; the pool waits
for it for at most `--recover-timeout` seconds (not `--startup-timeout`: a replica
that served once is expected back quickly), then gives the replica up. Every
failure episode becomes an incident (records/incidents.py): which replica, what
failed, its log and the first lines of the crash, recovered or not.
Replicas a target starts are started by `harness.ray_pools`; external endpoints are
wrapped by `external_pools`.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field

import aiohttp

from harness.backends import Backend, ReplicaFailure, make_backend
from harness.errors import HarnessError  # noqa: F401 - raised by the driver, which imports it from here
from harness.plan import EngineSpec, Plan, PoolPlan
from harness.replica import crash_excerpt


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
    log: str | None = None  # the server's log file (on node_id) for built-in replicas
    incarnation: int = 0  # bumped each time the replica comes back at a new URL (its caches are then empty)
    last_failure: str = ""  # the last incident's summary (for a pool that cannot be served)
    placement: dict | None = None  # where a started replica sits: node, GPU ids, CUDA_VISIBLE_DEVICES, device


class Pool:
    """A named group of replicas running the same engine settings."""

    def __init__(self, name: str, role: str, engine: EngineSpec, replicas: list[Replica], external: bool,
                 recover_timeout: float, api_key: str | None = None, backend: Backend | None = None) -> None:
        self.name, self.role, self.engine, self.replicas = name, role, engine, replicas
        self.external = external
        self.recover_timeout = recover_timeout
        self.api_key = api_key
        self.backend = backend or make_backend("sglang", api_key)  # how its servers are spoken to
        self.server_info: dict = {}
        self.incidents = None  # records.incidents.IncidentLog, set by the run

    @property
    def incremental_streams(self) -> bool:
        """Whether the pool's servers stream only what is new in each chunk (their /server_info says so)."""
        return bool(self.server_info.get("incremental_streaming_output"))

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

    def dead_message(self) -> str:
        """Why the pool cannot serve: each replica, its log and its last failure."""
        parts = [f"{r.replica_id} ({r.last_failure or 'failed'}" + (f"; log {r.log}" if r.log else "") + ")"
                 for r in self.replicas]
        return f"pool {self.name}: no healthy replica left: " + "; ".join(parts)

    def mark_failed(self, replica: Replica, url: str, http: aiohttp.ClientSession, error: str = "") -> None:
        """Take `replica` out of rotation after a failure seen at `url` and start its recovery."""
        if replica.url != url or not replica.healthy:
            return  # a late failure of an incarnation already replaced, or recovery under way
        replica.healthy = False
        replica.recovering = asyncio.ensure_future(self._recover(replica, http, error))

    async def _recover(self, replica: Replica, http: aiohttp.ClientSession, error: str) -> None:
        t0 = time.monotonic()
        deadline = t0 + self.recover_timeout
        incident = {"pool": self.name, "role": self.role, "replica_id": replica.replica_id, "url": replica.url,
                    "node_id": replica.node_id, "log": replica.log, "error": error[:500],
                    "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        print(f"[specgate] replica {replica.replica_id} failed ({error[:200]}); log {replica.log or 'n/a'}; "
              f"waiting up to {self.recover_timeout:g}s (--recover-timeout) for it to serve again", file=sys.stderr)
        gone = ""
        while time.monotonic() < deadline and not gone:
            url, node_id, info = replica.url, replica.node_id, None
            if replica.actor is not None:
                try:  # answers once Ray has restarted the actor and its server is healthy
                    info = await asyncio.wait_for(_await_ref(replica.actor.info.remote()),
                                                  timeout=max(1.0, deadline - time.monotonic()))
                    url, node_id = info["url"], info["node_id"]
                except Exception as e:  # noqa: BLE001 - restarting (ask again) or dead for good
                    gone = _actor_gone(e)
                    await asyncio.sleep(0 if gone else 0.2)
                    continue
            if await self.backend.health(http, url):
                self._recovered(replica, incident, info, url, node_id, time.monotonic() - t0)
                return
            await asyncio.sleep(0.2)
        await self._give_up(replica, incident, gone or f"not serving again within {self.recover_timeout:g}s "
                            "(--recover-timeout)")

    def _recovered(self, replica: Replica, incident: dict, info: dict | None, url: str, node_id, took: float):
        previous = (info or {}).get("previous") or {}
        incident.update(recovered=True, recovery_s=round(took, 2), new_url=url,
                        log=previous.get("log") or incident["log"], excerpt=previous.get("excerpt"))
        if url != replica.url:
            replica.incarnation += 1
        replica.url, replica.node_id, replica.healthy = url, node_id, True
        replica.log = (info or {}).get("log", replica.log)
        replica.placement = (info or {}).get("placement", replica.placement)  # Ray may have moved it
        replica.last_failure = f"recovered after {took:.1f}s"
        self._write(incident)
        print(f"[specgate] replica {replica.replica_id} serves again at {url} after {took:.1f}s", file=sys.stderr)

    async def _give_up(self, replica: Replica, incident: dict, reason: str) -> None:
        excerpt = crash_excerpt(reason) if "Traceback" in reason else None
        if excerpt is None and replica.log and replica.actor is not None and replica.node_id:
            excerpt = await read_remote_log(replica.node_id, replica.log)
        incident.update(recovered=False, reason=reason[:500], excerpt=excerpt)
        replica.dead = True
        replica.last_failure = f"gave up: {reason.splitlines()[0][:200] if reason else 'failed'}"
        self._write(incident)
        print(f"[specgate] replica {replica.replica_id} is given up: {reason[:300]}; log {replica.log or 'n/a'}",
              file=sys.stderr)

    def _write(self, incident: dict) -> None:
        if self.incidents is not None:
            self.incidents.write(incident)

    async def flush(self, http: aiohttp.ClientSession) -> None:
        """Empty the prefix cache of every healthy replica (between sweep points)."""
        for r in self.replicas:
            if r.healthy:
                try:
                    await self.backend.flush(http, r.url)
                except ReplicaFailure as e:
                    self.mark_failed(r, r.url, http, f"flush: {e}")


def _actor_gone(err: BaseException) -> str:
    """'' while a Ray actor may still come back; else why it is gone for good (restarts used up, or its
    constructor failed: the message then holds the server's log tail)."""
    try:
        import ray

        if isinstance(err, ray.exceptions.ActorDiedError):
            return str(err)
    except ImportError:
        pass
    return ""


async def read_remote_log(node_id: str, path: str) -> str | None:
    """The crash excerpt of a log file on node `node_id`, read by a small Ray task there."""
    try:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from harness.replica import read_log_excerpt

        task = ray.remote(num_cpus=0)(read_log_excerpt).options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))
        return await asyncio.wait_for(_await_ref(task.remote(path)), timeout=30)
    except Exception:  # noqa: BLE001 - the excerpt is a courtesy; the log path is reported anyway
        return None


async def _await_ref(ref):
    return await ref


def external_pools(plan: Plan, api_key: str | None, recover_timeout: float, backend: Backend | None = None
                   ) -> tuple[list[Pool], Pool]:
    """Pools over already-running servers (no Ray), spoken to through `backend` (default: SGLang's API)."""
    def make(p: PoolPlan) -> Pool:
        reps = [Replica(f"{p.name}-r{k}", url) for k, url in enumerate(p.endpoints)]
        return Pool(p.name, p.role, p.engine, reps, True, recover_timeout, api_key, backend)

    return [make(p) for p in plan.candidates], make(plan.reference)
