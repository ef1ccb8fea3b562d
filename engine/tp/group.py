"""Tensor-parallel context: which shard this process holds and how to all-reduce.

Sharding scheme (Megatron style): column-parallel projections split output
features by head, row-parallel projections split input features and all-reduce
their partial sums. The embedding / LM head and all norms are replicated.

Two communicators per group, as SGLang and vLLM keep them: a gloo group on CPU
for control (the authentication, each call rank 0 broadcasts) and, for the
model's all-reduces, the same gloo group on CPU or a NCCL group on CUDA.

The group is not open to the network: its rendezvous store and its gloo
connections listen on the address given (127.0.0.1 on one node), every rank
proves it holds the replica's shared secret before the group is used (a mutual
HMAC challenge over fresh nonces from every rank; the NCCL group is formed only
after it), and ranks exchange only tensors and JSON, never pickles, so a peer can
never make another run code.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import socket
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

NONCE_BYTES = 32
AUTH_CONTEXT = b"specgate-tp-auth-v1"


class GroupAuthError(RuntimeError):
    """A peer of the rank group could not prove it holds the shared secret."""


def rank_mac(secret: bytes, rank: int, nonces: bytes) -> bytes:
    """What rank `rank` must show: HMAC-SHA256 over the context, its rank and every rank's nonce."""
    return hmac.new(secret, AUTH_CONTEXT + rank.to_bytes(4, "big") + nonces, hashlib.sha256).digest()


def _listening_socket(addr: str, port: int) -> int:
    """A socket bound to addr:port (not to every interface, as TCPStore's own would be); its fd."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    s.listen(128)
    return s.detach()  # owned by the store from now on


def rank_device(device: str, rank: int) -> str:
    """The torch device of tensor-parallel rank `rank` of a replica served on `device`: each rank on a GPU of its
    own. `cuda` names the rank's own GPU: a rank that sees one GPU (a Ray rank actor, given its GPU in
    CUDA_VISIBLE_DEVICES) takes it, one that sees several (`engine.serve --tp-size N` on one machine) takes the
    rank-th. Any other device (`cpu`, an explicit `cuda:1`) is kept."""
    if device != "cuda":
        return device
    return f"cuda:{rank % max(torch.cuda.device_count(), 1)}"


class Group:
    """One replica's communicators: process groups of its own (no global default group).

    Owning the groups (instead of torch.distributed's process-wide default) lets one
    process hold several replicas, as tests do. `addr:port` is rank 0's rendezvous;
    `bind` is the address this rank's gloo connections listen on (default `addr`: every
    rank on one node); `device` is where this rank's tensors live (rank_device): on CUDA
    the all-reduces go through NCCL, on CPU through the gloo group.
    """

    def __init__(self, rank: int, size: int, addr: str, port: int, timeout_s: float, secret: bytes,
                 bind: str | None = None, device: str = "cpu"):
        if not secret:
            raise GroupAuthError("a tensor-parallel group needs a shared secret")
        timeout = timedelta(seconds=timeout_s)
        fd = _listening_socket(addr, port) if rank == 0 else -1
        self.store = dist.TCPStore(addr, port, size, is_master=rank == 0, timeout=timeout,
                                   **({"master_listen_fd": fd} if rank == 0 else {}))
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = timeout
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=bind or addr)]
        self.pg = dist.ProcessGroupGloo(self.store, rank, size, opts)
        self.rank, self.size = rank, size
        self._authenticate(secret)
        self.device_pg = self.pg if not device.startswith("cuda") else _nccl_group(self.store, rank, size, timeout,
                                                                                    device)

    def _all_gather_bytes(self, data: bytes) -> list[bytes]:
        mine = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        out = [[torch.empty_like(mine) for _ in range(self.size)]]
        self.pg.allgather(out, [mine]).wait()
        return [t.numpy().tobytes() for t in out[0]]

    def _authenticate(self, secret: bytes) -> None:
        """Every rank checks that every other rank holds `secret` (raises GroupAuthError naming it)."""
        nonces = b"".join(self._all_gather_bytes(secrets.token_bytes(NONCE_BYTES)))
        macs = self._all_gather_bytes(rank_mac(secret, self.rank, nonces))
        for r, mac in enumerate(macs):
            if not hmac.compare_digest(mac, rank_mac(secret, r, nonces)):
                raise GroupAuthError(f"tensor-parallel rank {r} failed authentication (wrong shared secret): "
                                     "refusing to work with it")

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks in place (gloo on CPU, NCCL on CUDA)."""
        self.device_pg.allreduce([x]).wait()
        return x

    def broadcast_json(self, obj=None):
        """Rank 0 sends `obj` (plain data: JSON), every other rank receives and returns it."""
        if self.rank == 0:
            data = torch.frombuffer(bytearray(json.dumps(obj, separators=(",", ":")).encode()), dtype=torch.uint8)
            n = torch.tensor([data.numel()], dtype=torch.long)
        else:
            n = torch.zeros(1, dtype=torch.long)
        self.pg.broadcast(n, 0).wait()
        if self.rank != 0:
            data = torch.empty(int(n), dtype=torch.uint8)
        self.pg.broadcast(data, 0).wait()
        return obj if self.rank == 0 else json.loads(data.numpy().tobytes())


def _nccl_group(store, rank: int, size: int, timeout: timedelta, device: str):
    """A NCCL group over the authenticated group's store (its own key prefix), on this rank's GPU."""
    if not dist.is_nccl_available():
        raise RuntimeError(f"tensor parallelism on {device} needs NCCL, which this torch build lacks")
    torch.cuda.set_device(device)
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = timeout
    return dist.ProcessGroupNCCL(dist.PrefixStore("nccl", store), rank, size, opts)


@dataclass(frozen=True)
class TPContext:
    """This rank's place in its replica's tensor-parallel group."""

    size: int = 1
    rank: int = 0
    group: Group | None = field(default=None, compare=False, repr=False)

    def shard(self, n: int, what: str) -> int:
        """The local share of `n` (heads, features), which must divide evenly."""
        if n % self.size:
            raise ValueError(f"{what} ({n}) is not divisible by tp_size ({self.size})")
        return n // self.size

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.size > 1:
            self.group.all_reduce(x)
        return x


SINGLE = TPContext()
