"""One engine replica: a Ray actor that runs the SGLang-compatible server as a subprocess on its node.

The actor starts the server on a free port, waits for /health from that server
(not from another process that took the port first: harness/ports.py) and reports
`(url, node_id, log)`. A watchdog thread exits the actor process when the server
dies, so Ray restarts the actor (at most `--max-replica-restarts` times), which
starts a new server and reports the first lines of its predecessor's crash:
restart policy stays Ray's. A server dies with its actor, whatever kills it: the
server is started through a tiny launcher that sets PR_SET_PDEATHSIG and forks a
watchdog that ends the server once the actor's pid is gone, and the actor exits
(stopping its server) once its raylet is gone (a node killed under it). The
launcher also adds the pool's niceness (`--reference-nice`) before it execs.

Nothing secret is on a command line: the API key and the tensor-parallel group's
secret reach the server in its environment (SPECGATE_API_KEY, SPECGATE_TP_SECRET),
the rank actors through Ray. The server binds 127.0.0.1 when the whole Ray cluster
is this one node (`bind="loopback"`), the node's address otherwise.

The server's CUDA_VISIBLE_DEVICES is exactly the GPUs Ray gave this actor from its
placement-group bundle ("" for none, whatever the Ray version), so a managed engine's
own TP workers start on the replica's GPUs and a CPU replica sees none; each rank
actor of a built-in replica holds its own bundle's GPU. `info` reports where the
replica and its ranks sit (harness/seat.py).
"""

from __future__ import annotations

import http.client
import os
import secrets
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.launcher import LAUNCHER as _LAUNCHER
from harness.ports import free_port, holds_port
from harness.rank_actor import RankActor
from harness.seat import Seat
from harness.server_logs import crash_excerpt, log_tail, previous_log, read_log_excerpt  # noqa: F401 - importers

NODE_CHECK_S = 1.0  # how often a replica actor looks whether its raylet (its parent process) is still there
API_KEY_ENV = "SPECGATE_API_KEY"  # engine/serve.py reads these two
TP_SECRET_ENV = "SPECGATE_TP_SECRET"


@dataclass(frozen=True)
class ServerSite:
    """Where one replica's server runs: what a target's environment function may read."""

    replica_id: str
    host: str  # the address it listens on
    log_dir: str
    workdir: str | None  # the project tree on this node (the driver's working directory), if it exists here
    api_key: str | None


def project_environment(env: dict, site: ServerSite) -> dict:
    """The built-in engine's environment: the project tree on PYTHONPATH (so `python -m engine.serve` imports the
    same code as the driver)."""
    if site.workdir:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [site.workdir, env.get("PYTHONPATH")]))
    return env


def resolve_command(command: tuple[str, ...] | list[str] | None) -> list[str]:
    """The server command on this node: default `python -m engine.serve`; a leading `python` is this
    interpreter (the node's project environment)."""
    cmd = list(command) if command else ["python", "-m", "engine.serve"]
    if cmd[0] in ("python", "python3"):
        cmd[0] = sys.executable
    return cmd


def http_ok(url: str, timeout: float = 2.0) -> bool:
    """Whether `url` answers 200; False for anything else, a port held by something that does not speak HTTP
    included (another process can take a port between free_port() and the server's bind)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError):
        return False


class ReplicaServer:
    """Actor body (wrapped with ray.remote by harness.pools): owns one server subprocess."""

    def __init__(self, replica_id: str, args: list[str], command: tuple[str, ...] | None, workdir: str | None,
                 startup_timeout: float, log_dir: str, engine_cfg: dict | None = None, api_key: str | None = None,
                 bind: str = "node", recover_timeout: float | None = None,
                 environment: Callable[[dict, ServerSite], dict] | None = None, nice: int = 0,
                 rank_gpus: float = 0) -> None:
        """`engine_cfg`: the built-in engine's EngineConfig as a dict (its rank actors are built from it).
        `bind`: "loopback" (the cluster is this node) or "node" (listen on the node's address).
        `recover_timeout`: the startup limit once Ray restarts this actor (default `startup_timeout`);
        `environment`: the target's function from the inherited environment to the server's (default
        `project_environment`; e.g. vLLM's own venv and cache, harness/targets/vllm.py);
        `nice`: added to the server's niceness (Linux; the reference pool's --reference-nice);
        `rank_gpus`: the GPUs each rank actor of a tensor-parallel built-in replica holds (its bundle's)."""
        import ray

        ctx = ray.get_runtime_context()
        self.replica_id = replica_id
        self.environment, self.log_dir = environment or project_environment, log_dir
        self.seat = Seat.here()
        self.node_id, self.node_ip = self.seat.node_id, self.seat.node_ip
        self.host = "127.0.0.1" if bind == "loopback" else self.node_ip
        self.restarts = int(getattr(ctx, "was_current_actor_reconstructed", False))
        self.api_key, self.nice = api_key, nice
        self.tp_secret = secrets.token_hex(32)
        self.previous: dict | None = None
        self._stopping = False
        self._serving = False
        self._proc: subprocess.Popen | None = None
        self.workdir = workdir if workdir and os.path.isdir(workdir) else None
        self._watch_node()
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        if self.restarts:  # what killed the incarnation before this one
            prev = previous_log(Path(log_dir), replica_id)
            if prev is not None:
                self.previous = {"log": str(prev), "excerpt": read_log_excerpt(str(prev))}
            startup_timeout = recover_timeout or startup_timeout
        self.ranks: list = []
        self.rank_seats: list[dict] = []
        self.rank_gpus = rank_gpus
        self.engine_cfg = engine_cfg
        tp_size = int((engine_cfg or {}).get("tp_size", 1))
        last_error = ""
        for attempt in range(3):  # a port can be taken between free_port() and the server's bind
            self.port = free_port(self.host)
            self.url = f"http://{self.host}:{self.port}"
            self.log_path = Path(log_dir) / f"{replica_id}-{time.strftime('%H%M%S')}-{os.getpid()}-{attempt}.log"
            cmd = resolve_command(command) + list(args) + ["--host", self.host, "--port", str(self.port)]
            if tp_size > 1:
                rendezvous = free_port(self.host)
                cmd += ["--tp-rendezvous", f"{self.host}:{rendezvous}"]
            self._start(cmd)
            if tp_size > 1:
                self._start_ranks(tp_size, rendezvous)
            last_error = self._wait_healthy(startup_timeout)
            if not last_error:
                self._serving = True
                # the server is healthy, so every rank joined its group: their actors exist
                self.rank_seats = ray.get([a.seat.remote() for a in self.ranks], timeout=60)
                return
            self._terminate()
        raise RuntimeError(f"replica {replica_id}: server did not become healthy: {last_error}")

    def _start(self, cmd: list[str]) -> None:
        """Start the server from a watchdog thread that outlives it (PDEATHSIG follows the forking thread)."""
        started = threading.Event()
        failure: list[BaseException] = []
        env = dict(os.environ)
        env.pop(API_KEY_ENV, None)
        if self.api_key:
            env[API_KEY_ENV] = self.api_key
        env[TP_SECRET_ENV] = self.tp_secret
        env["SPECGATE_NICE"] = str(self.nice)  # the launcher applies it
        env["CUDA_VISIBLE_DEVICES"] = self.seat.cuda_visible_devices  # exactly this replica's GPUs, "" for none
        env = self.environment(env, ServerSite(self.replica_id, self.host, self.log_dir, self.workdir, self.api_key))

        def watchdog() -> None:
            launch = [sys.executable, "-c", _LAUNCHER, str(os.getpid()), *cmd]
            try:
                with open(self.log_path, "ab") as log:
                    self._proc = subprocess.Popen(launch, stdout=log, stderr=subprocess.STDOUT,
                                                  stdin=subprocess.DEVNULL, cwd=self.workdir, env=env)
            except BaseException as e:  # noqa: BLE001 - reported to the starting thread
                failure.append(e)
                return
            finally:
                started.set()
            code = self._proc.wait()
            if self._serving and not self._stopping:
                sys.stderr.write(f"[specgate] replica {self.replica_id}: server exited with {code}; "
                                 "exiting the actor so that Ray restarts it\n")
                sys.stderr.flush()
                os._exit(1)

        threading.Thread(target=watchdog, name=f"watchdog-{self.replica_id}", daemon=True).start()
        started.wait()
        if failure:
            raise RuntimeError(f"replica {self.replica_id}: cannot start {cmd[0]}: {failure[0]}")

    def _watch_node(self) -> None:
        """Exit the actor, its server stopped first, once its raylet (the parent process) is gone: a worker whose
        node died is re-parented and lives on, and so would its server."""
        raylet = os.getppid()
        if raylet <= 1:
            return  # started by init itself: no raylet to watch

        def watch() -> None:
            while os.getppid() == raylet:
                time.sleep(NODE_CHECK_S)
            sys.stderr.write(f"[specgate] replica {self.replica_id}: its raylet (pid {raylet}) is gone; stopping "
                             "the server and exiting\n")
            self._stopping = True
            self._terminate()
            os._exit(1)

        threading.Thread(target=watch, name=f"node-watch-{self.replica_id}", daemon=True).start()

    def _start_ranks(self, tp_size: int, port: int) -> None:
        """Ranks 1..N-1 as Ray actors in bundles 1..N-1 of this replica's placement group.

        They join rank 0 (the server this actor started, in bundle 0) at host:port; rank 0's
        address is this node's, i.e. bundle 0's.
        """
        import ray
        from ray.util import get_current_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        pg = get_current_placement_group()
        cls = ray.remote(num_cpus=1, num_gpus=self.rank_gpus, max_restarts=0)(RankActor)
        for a in self.ranks:
            ray.kill(a, no_restart=True)
        self.ranks = [
            cls.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=r))
            .remote(self.engine_cfg, r, tp_size, self.host, port, self.tp_secret.encode(),
                    self.host == "127.0.0.1", self.nice)
            for r in range(1, tp_size)
        ]

    def rank_pids(self) -> list[int]:
        """Process ids of this replica's rank actors (for tests that kill one)."""
        import ray

        return ray.get([a.ping.remote() for a in self.ranks], timeout=30)

    def _wait_healthy(self, timeout: float) -> str:
        """'' once /health answers 200 from this replica's own server; else why not (server exited, the port is
        held by another process, or the timeout)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code = self._proc.poll()
            if code is not None:
                return f"exited with status {code}; log {self.log_path}:\n{log_tail(self.log_path)}"
            if http_ok(f"{self.url}/health"):
                if holds_port(self._proc.pid, self.port) is False:  # None: cannot be told here (no /proc)
                    return (f"port {self.port} answers /health but another process holds it (taken between "
                            "free_port() and the server's bind)")
                return ""
            time.sleep(0.1)
        return f"no healthy /health within {timeout:g}s; log {self.log_path}:\n{log_tail(self.log_path)}"

    def _terminate(self) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def info(self) -> dict:
        """Where this replica serves; raises if its server is gone (the actor is about to restart)."""
        if self._proc is None or self._proc.poll() is not None:
            raise RuntimeError(f"replica {self.replica_id}: server is not running")
        return {"replica_id": self.replica_id, "url": self.url, "node_id": self.node_id,
                "pid": self._proc.pid, "restarted": bool(self.restarts), "log": str(self.log_path),
                "previous": self.previous, "placement": {**self.seat.to_json(), "ranks": self.rank_seats}}

    def stop(self) -> None:
        """Stop the server for good (the watchdog then leaves the actor alive, to be killed)."""
        self._stopping = True
        self._terminate()
        import ray

        for a in self.ranks:
            ray.kill(a, no_restart=True)
