"""Pools of replicas as the driver sees them.

`Pool` is the driver-side view: replicas with a URL and a health flag, session
affinity with fail-over, and recovery of a failed replica (wait for Ray to
restart its actor, then for /health). Built-in replicas are started by
`harness.ray_pools`; external endpoints are wrapped by `external_pools`.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field

import aiohttp

from harness.backends import Backend, ReplicaFailure, make_backend
from harness.plan import EngineSpec, Plan, PoolPlan


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
                 recover_timeout: float, api_key: str | None = None, backend: Backend | None = None) -> None:
        self.name, self.role, self.engine, self.replicas = name, role, engine, replicas
        self.external = external
        self.recover_timeout = recover_timeout
        self.api_key = api_key
        self.backend = backend or make_backend("sglang", api_key)  # how its servers are spoken to
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
            if await self.backend.health(http, url):
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
                    await self.backend.flush(http, r.url)
                except ReplicaFailure:
                    self.mark_failed(r, r.url, http)


async def _await_ref(ref):
    return await ref


def external_pools(plan: Plan, api_key: str | None, recover_timeout: float, backend: Backend | None = None
                   ) -> tuple[list[Pool], Pool]:
    """Pools over already-running servers (no Ray), spoken to through `backend` (default: SGLang's API)."""
    def make(p: PoolPlan) -> Pool:
        reps = [Replica(f"{p.name}-r{k}", url) for k, url in enumerate(p.endpoints)]
        return Pool(p.name, p.role, p.engine, reps, True, recover_timeout, api_key, backend)

    return [make(p) for p in plan.candidates], make(plan.reference)


