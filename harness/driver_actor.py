"""One driver actor: a share of a sweep point's sessions, sent and recorded by a process of its own.

The head (harness/driver_actors.py) gives each actor, per sweep point, the sessions it runs, their concurrency
(closed loop) or their planned send times (open loop); the actor runs them through the same session loop as a
single driver (harness/sessions.py: turns in order on the session's replica, references, restore-window
probes), writes its records to its own journals under its own lock (records/driver_parts.py), and returns the
point's counts. Its reference requests are shared with the other actors through the registry
(harness/shared_refs.py). The head polls `counters` to merge the progress of all actors.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp

from harness.pools import Pool
from harness.progress import Progress
from harness.recorded import RunSoFar
from harness.recorder import Recorder
from harness.sender import Sender
from harness.sessions import SessionLoop
from harness.shared_refs import SharedReferences
from harness.sweep import Point, PointCounts, StopRule
from harness.window import WindowProbe
from records.driver_parts import DriverParts
from records.incidents import IncidentLog
from records.resume import Recorded, RefDone


@dataclass(frozen=True)
class ActorSpec:
    """What a driver actor is started with (pickled to it once)."""

    name: str  # d0, d1, ...: its directory under RUN_DIR/drivers
    run_id: str
    run_dir: str
    candidates: list[Pool]
    reference: Pool
    sessions: dict[str, tuple]  # pool -> its sessions, in workload order (the head sends indices into them)
    recorded: dict[str, Recorded] = field(default_factory=dict)  # what earlier processes recorded
    io: dict[str, tuple] = field(default_factory=dict)  # key -> (input ids, output ids) of continued turns
    answered: dict[str, RefDone] = field(default_factory=dict)  # input hash -> reference already written
    request_timeout: float = 600.0
    max_retries: int = 3
    reference_concurrency: int = 8
    tokenizers: dict[str, str] = field(default_factory=dict)
    decode: object = None
    seed: int = 0
    duration: float | None = None
    max_error_rate: float | None = None
    windows: bool = True


class DriverActor:
    """A driver process of the run (run as a Ray async actor; see module doc)."""

    def __init__(self, spec: ActorSpec, registry) -> None:
        if "torch" in sys.modules:  # a driver computes nothing: no thread pool competing with the servers
            sys.modules["torch"].set_num_threads(1)
        self.spec, self.registry = spec, registry
        self.pools = {p.name: p for p in spec.candidates}
        self.ready = False

    async def start(self) -> str:
        """Open the actor's journals and its HTTP client; returns the node it runs on. Raises when the run
        directory is not here (a node without the shared filesystem the run directory must be on)."""
        s = self.spec
        run_dir = Path(s.run_dir)
        if not (run_dir / "config.json").is_file():
            raise FileNotFoundError(f"driver actor {s.name} on {socket.gethostname()}: the run directory {run_dir} "
                                    "is not on this node (driver actors write into it: it must be on a filesystem "
                                    "every node shares)")
        self.files = DriverParts(run_dir, s.name, command=f"specgate driver actor {s.name} of run {s.run_id}")
        incidents = IncidentLog(run_dir)
        for pool in (*s.candidates, s.reference):
            pool.incidents = incidents
        self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        self.progress = Progress(0, 0, enabled=False)
        self.so_far = RunSoFar(s.recorded, s.answered)
        self.so_far.io = dict(s.io)
        self.sender = Sender(run_id=s.run_id, http=self.http, progress=self.progress,
                             request_timeout=s.request_timeout, max_retries=s.max_retries)
        self.recorder = Recorder(run_id=s.run_id, files=self.files, progress=self.progress, tokenizers=s.tokenizers,
                                 decode=s.decode)
        self.references = SharedReferences(s.reference, registry=self.registry, sender=self.sender,
                                           recorder=self.recorder, progress=self.progress,
                                           concurrency=s.reference_concurrency, answered=self.so_far.references)
        self.windows = WindowProbe(self.sender, self.references, enabled=s.windows)
        self.sessions = SessionLoop(sender=self.sender, recorder=self.recorder, references=self.references,
                                    windows=self.windows, so_far=self.so_far, seed=s.seed)
        self.ready = True
        import ray

        return ray.get_runtime_context().get_node_id()

    async def run_point(self, pool_name: str, point: Point, indices: list[int], concurrency: int | None,
                        planned: dict[int, dict[int, float]] | None, wall0: float) -> dict:
        """Run sessions `indices` of `pool_name` at `point` (closed loop: `concurrency` in flight; open loop: each
        turn at `wall0` + its `planned` offset); returns the point's counts, why it stopped early (or None) and
        the restore-window probes' cache hits per replica, once every record is written."""
        pool = self.pools[pool_name]
        sessions = self.spec.sessions[pool_name]
        todo = [(i, sessions[i]) for i in indices]
        stop = StopRule(self.spec.duration, self.spec.max_error_rate, PointCounts())
        where = (pool_name, point.label)
        fatal = self.references.fatal
        work = asyncio.ensure_future(self.sessions.run(pool, point, todo, stop, wall0, concurrency, planned))
        await asyncio.wait({work, fatal}, return_when=asyncio.FIRST_COMPLETED)
        if fatal.done():  # the reference pool cannot be served: nothing left could be judged
            work.cancel()
            self.windows.cancel()
            await asyncio.gather(work, return_exceptions=True)
            raise fatal.exception()
        await work
        await self.windows.drain(where)
        hits = {rid: n for (p, label, rid), n in list(self.windows.hits.items()) if (p, label) == where}
        for rid in hits:
            self.windows.hits_of(pool_name, point.label, rid)
        return {"counts": asdict(stop.counts), "stopped": stop.reason, "timed_out": stop.timed_out, "hits": hits}

    def counters(self) -> dict:
        """This actor's progress so far (cumulative): the head merges every actor's."""
        p = self.progress
        return {"done": p.done, "errors": p.errors, "mismatches": p.mismatches, "retries": p.retries,
                "references": p.references}

    def cpu(self) -> float:
        """CPU seconds this actor's process has used (a benchmark's client CPU per request)."""
        return time.process_time()

    async def finish(self) -> dict:
        """Wait for this actor's references, close its journals and client; returns its final counters."""
        if self.ready:
            await self.references.wait()
            await self.http.close()
            self.files.close()
            self.ready = False
        return self.counters()
