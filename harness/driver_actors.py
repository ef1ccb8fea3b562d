"""The load generator across Ray actors (`--drivers N`): the head orchestrates, N driver actors send and record.

The head process keeps everything a sweep point does once: it flushes the pool's caches, sends the warmup,
reads the cache counters, writes the point's record and serves the references an earlier process owed. What
grows with the load, the sessions, is split across driver actors (harness/driver_actor.py), placed round robin
on the cluster's alive nodes, the head's own last (`spread_nodes`; no CPU reserved: a driver mostly waits on
the network):

* a session runs whole on one actor, on the replica it would use with one driver (its index picks it);
* sweep points run in lock step: every actor finishes point p before any starts p + 1;
* closed loop (`--concurrency C`): the point's unfinished sessions are dealt round robin to min(N, C) actors and
  C is split so that the shares add up to C (the first C mod n actors run one more); a share that runs out
  early leaves its slots idle, so near the end fewer than C may be in flight (one driver refills them);
* open loop (`--request-rate R`): the plan is the one a single driver makes (harness/arrival.py), and each
  actor sends its sessions' turns at their planned times, so the actors' streams add up to exactly that plan;
* references: one per distinct input for the run, whichever actor meets it first (harness/shared_refs.py);
* records: each actor writes its own journals under its own lock (records/driver_parts.py), joined into the
  run's records when the run ends, fails or is resumed; a resume goes on from every actor's records;
* progress: the head polls every actor's counters and shows one merged line.

A driver actor that dies stops the run (exit 2) with everything recorded kept: `--resume` finishes it.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import math
import os
import sys
from pathlib import Path

from harness.driver import Driver
from harness.driver_actor import ActorSpec, DriverActor
from harness.errors import ConfigError, HarnessError
from harness.pools import Pool
from harness.sessions import planned_offsets
from harness.shared_refs import ReferenceRegistry
from harness.sweep import Point, StopRule
from records.driver_parts import adopt
from records.lock import RunLocked

# --drivers auto: what one driver process is planned to carry. benchmarks/driver_actors_bench.py measured a
# client CPU of about 0.75 ms per candidate request (its reference included) against an instant server, in one
# process or per actor, so one core saturates near 1,300 candidate requests/s: a driver is planned for under
# half of that. A closed loop's rate depends on the servers' latency, unknown before the run: its streams are
# the proxy, and 512 per driver is a choice, not a measurement.
STREAMS_PER_DRIVER = 512  # closed loop: requests in flight
RATE_PER_DRIVER = 500.0  # open loop: candidate requests per second
POLL_S = 0.5  # how often the head merges the actors' progress


def auto_drivers(concurrency: tuple[int, ...], request_rate: tuple[float, ...], pools: int, sequential: bool,
                 cpus: int | None = None) -> int:
    """--drivers when not given: 1, unless the busiest sweep point's load (summed over the pools that run at once)
    exceeds what one process carries; then one per STREAMS_PER_DRIVER streams or RATE_PER_DRIVER requests/s,
    at most one per CPU core of this node."""
    together = 1 if sequential else pools
    need = max(math.ceil(max(concurrency, default=0) * together / STREAMS_PER_DRIVER),
               math.ceil(max(request_rate, default=0.0) * together / RATE_PER_DRIVER), 1)
    return max(1, min(need, cpus or os.cpu_count() or 1))


def resolve_drivers(cfg, sessions: dict[str, list]) -> int:
    """The number of driver actors for this run (`cfg`: the RunConfig; --drivers, else auto, and 1 for a target
    without a Ray cluster), checked before anything starts: ConfigError for --drivers below 1, above 1 for
    servers the harness does not start, or above the sessions of the largest pool (an actor would idle)."""
    n, most = cfg.drivers, max((len(s) for s in sessions.values()), default=0)
    if n is None:
        if not cfg.target.managed:
            return 1
        return min(auto_drivers(cfg.concurrency, cfg.request_rate, len(sessions), cfg.sequential_pools), max(most, 1))
    if n < 1:
        raise ConfigError(f"--drivers must be >= 1, got {n}")
    if n > 1 and not cfg.target.managed:
        raise ConfigError(f"--drivers {n}: driver actors run on the Ray cluster of a target whose replicas the "
                          "harness starts; --endpoint servers are driven from this process only")
    if n > most:
        raise ConfigError(f"--drivers {n}: more driver actors than sessions (the largest pool has {most}); a "
                          "session runs whole on one actor, so use at most that many")
    return n


def spread_nodes() -> list[str]:
    """The alive nodes of the cluster, in the order driver actors are placed on them (actor k on node k mod
    n): every other node before this one, which the head itself runs on."""
    import ray

    here = ray.get_runtime_context().get_node_id()
    alive = sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))
    return [n for n in alive if n != here] + [n for n in alive if n == here]


def split_concurrency(c: int, n: int) -> list[int]:
    """C requests in flight over n actors: shares that add up to C, the first C mod n one larger."""
    return [c // n + (k < c % n) for k in range(n)]


def _portable(pool: Pool) -> Pool:
    """A copy of `pool` that pickles to an actor: its replicas as they are now, without a recovery task."""
    out = copy.copy(pool)
    out.replicas = [dataclasses.replace(r, recovering=None) for r in pool.replicas]
    return out


class ActorSessions:
    """The head's side of the driver actors: starts them, deals each sweep point's sessions, merges what they
    report; stands in for the single driver's session loop and restore-window probe (`run`, `drain`, `cancel`,
    `hits_of`)."""

    def __init__(self, n: int, run_id: str, run_dir: Path, progress, seed: int) -> None:
        self.n, self.run_id, self.run_dir, self.progress, self.seed = n, run_id, Path(run_dir), progress, seed
        self.actors: list = []
        self.names: list[str] = []
        self.registry = None
        self.seen: dict[str, dict] = {}  # actor name -> its counters last merged
        self.hits: dict[tuple[str, str, str], int] = {}

    async def start(self, spec: dict) -> None:
        """Start the registry and the N actors (`spec`: ActorSpec's fields but the name) and wait until each has
        opened its journals."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.registry = ray.remote(ReferenceRegistry).options(num_cpus=0).remote(spec["answered"])
        cls = ray.remote(DriverActor)
        spec = {**spec, "candidates": [_portable(p) for p in spec["candidates"]],
                "reference": _portable(spec["reference"])}
        nodes = spread_nodes()
        for k in range(self.n):
            name = f"d{k}"
            self.names.append(name)
            where = NodeAffinitySchedulingStrategy(nodes[k % len(nodes)], soft=False) if nodes else "SPREAD"
            self.actors.append(cls.options(name=f"specgate-driver-{self.run_id}-{name}", num_cpus=0,
                                           scheduling_strategy=where, max_restarts=0)
                               .remote(ActorSpec(name=name, **spec), self.registry))
        nodes = await self._all([a.start.remote() for a in self.actors])
        self.progress.write(f"driver actors: {self.n} on {len(set(nodes))} node(s)")

    async def run(self, pool: Pool, point: Point, todo: list[tuple[int, object]], stop: StopRule,
                  wall0: float) -> None:
        """Deal the point's unfinished sessions to the actors (module doc), run them, add up their counts."""
        n = min(self.n, len(todo), point.concurrency or len(todo))
        shares = [todo[k::n] for k in range(n)]
        plan = planned_offsets(todo, point, self.seed) if point.rate is not None else None
        conc = split_concurrency(point.concurrency, n) if point.rate is None else [None] * n
        calls = [a.run_point.remote(pool.name, point, [i for i, _ in share], c,
                                    None if plan is None else {i: plan[i] for i, _ in share}, wall0)
                 for a, share, c in zip(self.actors, shares, conc, strict=False)]
        poll = asyncio.ensure_future(self._poll())
        try:
            results = await self._all(calls)
        finally:
            poll.cancel()
            await asyncio.gather(poll, return_exceptions=True)
            await self._merge()
        c = stop.counts
        for r in results:
            for k in ("sent", "answered", "failed", "skipped", "unsent"):
                setattr(c, k, getattr(c, k) + r["counts"][k])
            stop.timed_out |= r["timed_out"]
            if r["stopped"] and not r["timed_out"] and stop.error_stop is None:
                stop.error_stop = r["stopped"]
            for rid, hits in r["hits"].items():
                where = (pool.name, point.label, rid)
                self.hits[where] = self.hits.get(where, 0) + hits

    async def drain(self, where) -> None:
        """Nothing to wait for: each actor wrote every record of its share before its point returned."""

    def cancel(self, where=None) -> None:
        """Nothing to cancel here: a stopping run kills the actors (`close`)."""

    def hits_of(self, pool: str, point: str, replica_id: str) -> int:
        """The cached tokens the actors' restore-window probes got from `replica_id` at that point."""
        return self.hits.pop((pool, point, replica_id), 0)

    async def finish(self) -> None:
        """Let every actor finish its references and close its journals."""
        await self._all([a.finish.remote() for a in self.actors])
        await self._merge()

    def close(self) -> int:
        """Kill the actors (a no-op for those that finished) and join their journals into the run's records;
        returns the records joined."""
        import ray

        for a in [*self.actors, self.registry]:
            if a is not None:
                ray.kill(a, no_restart=True)
        for a in self.actors:  # a journal moves only once its writer is gone: Ray answers a dead actor's call so
            try:
                ray.get(a.cpu.remote(), timeout=10)
            except Exception:  # noqa: BLE001 - dead (what is waited for), or not yet: adopt waits for its lock
                pass
        self.actors.clear()
        try:
            return adopt(self.run_dir)
        except RunLocked as e:  # the records stay where a resume joins them
            print(f"specgate: warning: the driver actors' records stay in {self.run_dir / 'drivers'} ({e}); "
                  "--resume joins them", file=sys.stderr)
            return 0

    async def _all(self, refs: list) -> list:
        """Await every call; the first actor failure stops the run as a HarnessError naming the actor."""
        import ray

        try:
            return await asyncio.gather(*refs)
        except ray.exceptions.RayTaskError as e:
            cause = e.cause if isinstance(e.cause, BaseException) else e
            if isinstance(cause, HarnessError):
                raise HarnessError(str(cause)) from None
            raise HarnessError(f"a driver actor failed: {cause}") from None
        except ray.exceptions.RayActorError as e:
            raise HarnessError(f"a driver actor died ({str(e).splitlines()[0]}); its records so far are kept: finish "
                               f"the run with --resume {self.run_dir}") from None

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            await self._merge()

    async def _merge(self) -> None:
        """Add what each live actor counted since the last merge to the head's progress."""
        for name, actor in zip(self.names, self.actors, strict=False):
            try:
                now = await actor.counters.remote()
            except Exception:  # noqa: BLE001 - a dead actor's failure is reported by its point
                continue
            before = self.seen.get(name, {})
            self.progress.add(**{k: v - before.get(k, 0) for k, v in now.items()})
            self.seen[name] = now


class ActorDriver(Driver):
    """The driver with its sessions sent by N driver actors (module doc); the head keeps the rest."""

    def __init__(self, *, drivers: int, run_dir: Path, spec: dict, **kwargs) -> None:
        super().__init__(**kwargs)
        self.spec = spec  # what every actor is started with (ActorSpec's fields but name, sessions, so far)
        self.remote = ActorSessions(drivers, self.run_id, run_dir, self.progress, spec.get("seed", 0))
        self.sessions = self.windows = self.remote

    async def run(self, sessions: dict[str, tuple]) -> None:
        """Serve what an earlier process owed, start the actors with the run so far, run every sweep point."""
        owed = self.so_far.load(self.files.dir.parent, sessions, [p.label for p in self.points])
        for _ in range(self.so_far.mismatches()):
            self.progress.mismatch()
        for rec, session in owed:
            ids = self.so_far.io[rec.key][0]
            self.references.compare(rec, self.references.answer(ids, rec.input_hash, rec.max_new_tokens, session,
                                                                rec.turn))
        await self.references.wait()  # before the registry starts: it then knows every reference written
        await self.remote.start({**self.spec, "sessions": sessions, "recorded": self.so_far.candidates,
                                 "io": self.so_far.io, "answered": dict(self.references.done)})
        await self._pools(sessions)
        await self.remote.finish()

    async def close(self) -> None:
        """Stop the actors and join their records into the run's (also after a failure: a resume reads them)."""
        self.remote.close()


def actor_spec(drivers: int, run_dir: Path, kwargs: dict) -> dict:
    """What every driver actor is started with, from the single driver's arguments: each gets an even share of
    the reference requests allowed in flight (at least 1)."""
    keep = ("run_id", "candidates", "reference", "request_timeout", "max_retries", "tokenizers", "decode", "seed",
            "duration", "max_error_rate", "windows")
    spec = {k: kwargs[k] for k in keep if k in kwargs}
    spec.update(run_dir=str(run_dir), reference_concurrency=max(1, kwargs.get("reference_concurrency", 8) // drivers))
    return spec


def make_driver(drivers: int, run_dir: Path, **kwargs) -> Driver:
    """The run's driver (Driver's arguments): a single one in this process for `drivers` 1, else the head of
    `drivers` actors."""
    if drivers <= 1:
        return Driver(**kwargs)
    return ActorDriver(drivers=drivers, run_dir=run_dir, spec=actor_spec(drivers, run_dir, kwargs), **kwargs)
