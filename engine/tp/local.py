"""Standalone tensor parallelism for `python -m engine.serve --tp-size N`: ranks as local processes."""

from __future__ import annotations

import secrets
import socket
import threading

import torch.multiprocessing as mp

from engine.config import EngineConfig
from engine.engine import Engine
from engine.server.async_engine import AsyncEngine
from engine.tp.ranks import RankWorker, TPRunner


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(cfg: EngineConfig, rank: int, size: int, addr: str, port: int, secret: bytes) -> None:
    RankWorker(cfg, rank, size, addr, port, secret).serve_forever()


def start_local(cfg: EngineConfig, addr: str = "127.0.0.1", port: int | None = None):
    """Start ranks 1..N-1 as processes and build rank 0's Engine; returns (engine, processes, dead).

    The group's secret is drawn here and reaches the children through their spawn pipe.
    """
    size = cfg.tp_size
    port = port or free_port()
    secret = secrets.token_bytes(32)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, args=(cfg, r, size, addr, port, secret), daemon=True,
                         name=f"tp-rank{r}") for r in range(1, size)]
    for p in procs:
        p.start()

    def dead() -> list[str]:
        return [f"rank {r} (pid {p.pid}, exit code {p.exitcode})" for r, p in enumerate(procs, 1) if not p.is_alive()]

    runner = TPRunner(cfg, size, addr, port, secret, alive=dead)
    return Engine(cfg, runner=runner), procs, dead


def build_engine(cfg: EngineConfig, rendezvous: str | None = None, secret: bytes | None = None,
                 **liveness) -> AsyncEngine:
    """The serve hook: an AsyncEngine over a TP replica, failed as soon as a rank is known dead.

    Without `rendezvous` the ranks are local processes. With `HOST:PORT` they are started
    elsewhere (Ray rank actors, see harness/replica.py) and join there, proving they hold
    `secret`; a rank failure then shows up as the next step's RankFailure. Either way the
    engine's death ends the server (engine/serve.py), so its supervisor restarts the replica.
    """
    if rendezvous:
        host, _, port = rendezvous.rpartition(":")
        runner = TPRunner(cfg, cfg.tp_size, host.strip("[]"), int(port), secret)
        return AsyncEngine(cfg, engine=Engine(cfg, runner=runner), **liveness)
    engine, procs, dead = start_local(cfg)
    ae = AsyncEngine(cfg, engine=engine, **liveness)

    def watchdog() -> None:
        while ae.health_error is None:
            gone = dead()
            if gone:
                ae.fail(f"tensor-parallel {', '.join(gone)} died")
                return
            threading.Event().wait(0.5)

    threading.Thread(target=watchdog, name="tp-watchdog", daemon=True).start()
    return ae
