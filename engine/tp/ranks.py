"""Tensor-parallel replicas: rank workers and the rank-0 runner proxy.

A replica with tp_size N is N processes, each a `ModelRunner` over its shard of
the heads (see engine/tp/group.py for the split), joined by a torch.distributed
group (gloo on CPU, NCCL on CUDA). Rank 0 runs the scheduler; every runner call
that touches model state is broadcast to the other ranks before rank 0 runs it,
so all ranks execute the same step (the "plan" is the call and its plain-int
arguments, sent as JSON and checked against `MIRRORED` before it runs: a rank
never unpickles what it receives). The embedding / LM head is replicated, so every rank ends a forward
with the same logits and rank 0 decides on its own copy. The DFlash drafter runs
on rank 0 only.

One rank-worker implementation serves both launchers: `python -m engine.serve
--tp-size N` starts ranks 1..N-1 with torch.multiprocessing (engine/tp/local.py);
the harness starts them as Ray actors in the replica's placement group (harness/replica.py).
Each rank computes on a device of its own (`group.rank_device`): on CUDA its own GPU.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from engine.config import EngineConfig
from engine.runner import ModelRunner
from engine.tp.group import Group, TPContext, rank_device

MIRRORED = ("extend", "decode", "verify", "commit_verify", "copy_state", "zero_states")
STOP = "stop"
DEFAULT_TIMEOUT_S = 30.0


class RankFailure(RuntimeError):
    """A tensor-parallel rank stopped answering; the message names it."""


def encode_call(name: str, args: tuple, kwargs: dict) -> list:
    """A runner call as plain data for `Group.broadcast_json`."""
    return [name, list(args), dict(kwargs)]


def decode_call(msg) -> tuple[str, list, dict]:
    """(name, args, kwargs) of a received call; ValueError unless it is a mirrored call (or stop) in plain data."""
    if not (isinstance(msg, list) and len(msg) == 3 and isinstance(msg[0], str) and isinstance(msg[1], list)
            and isinstance(msg[2], dict)):
        raise ValueError(f"tensor-parallel call: malformed message {str(msg)[:80]!r}")
    name, args, kwargs = msg
    if name != STOP and name not in MIRRORED:
        raise ValueError(f"tensor-parallel call: {name[:40]!r} is not a mirrored runner call")
    return name, args, kwargs


def build_runner(cfg: EngineConfig, group: Group) -> ModelRunner:
    """This rank's runner over its shard, on its own device."""
    from engine.engine import pool_pages, pool_slots

    torch.set_num_threads(1)  # ranks share the node's cores
    cfg = replace(cfg, device=rank_device(cfg.device, group.rank))
    return ModelRunner(cfg, pool_pages(cfg), pool_slots(cfg), TPContext(group.size, group.rank, group))


class RankWorker:
    """Ranks 1..N-1: replay every call rank 0 broadcasts until told to stop."""

    def __init__(self, cfg: EngineConfig, rank: int, size: int, addr: str, port: int, secret: bytes,
                 bind: str | None = None):
        self.group = Group(rank, size, addr, port, DEFAULT_TIMEOUT_S, secret, bind, rank_device(cfg.device, rank))
        self.runner = build_runner(cfg, self.group)

    def serve_forever(self) -> None:
        while True:
            name, args, kwargs = decode_call(self.group.broadcast_json())
            if name == STOP:
                return
            getattr(self.runner, name)(*args, **kwargs)


class TPRunner:
    """Rank 0's runner: broadcasts each state-changing call, then runs it on its own shard."""

    def __init__(self, cfg: EngineConfig, size: int, addr: str, port: int, secret: bytes, alive=None):
        self.group = Group(0, size, addr, port, DEFAULT_TIMEOUT_S, secret, device=rank_device(cfg.device, 0))
        self.local = build_runner(cfg, self.group)
        self.size = size
        self.alive = alive  # optional callable -> list of dead rank descriptions
        self.failure: str | None = None

    def __getattr__(self, name):
        attr = getattr(self.local, name)
        if name not in MIRRORED:
            return attr

        def mirrored(*args, **kwargs):
            self._broadcast(encode_call(name, args, kwargs))
            try:
                return attr(*args, **kwargs)
            except RuntimeError as e:  # a collective inside the forward failed
                raise self._failure(e) from e

        return mirrored

    def _broadcast(self, msg) -> None:
        if self.failure:
            raise RankFailure(self.failure)
        try:
            self.group.broadcast_json(msg)
        except RuntimeError as e:
            raise self._failure(e) from e

    def _failure(self, err: BaseException) -> RankFailure:
        dead: list[str] = []
        deadline = time.monotonic() + 2.0  # a killed process takes a moment to be reaped
        while self.alive is not None and not dead and time.monotonic() < deadline:
            dead = self.alive()
            if not dead:
                time.sleep(0.1)
        others = "rank 1" if self.size == 2 else f"one of ranks 1..{self.size - 1}"
        who = ", ".join(dead) if dead else others
        self.failure = f"tensor-parallel rank failure ({who}): {err}"
        return RankFailure(self.failure)

    def shutdown(self) -> None:
        if self.failure is None:
            try:
                self.group.broadcast_json(encode_call(STOP, (), {}))
            except RuntimeError:
                pass
            self.failure = "shut down"
