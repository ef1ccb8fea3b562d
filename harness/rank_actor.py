"""The rank actors of a tensor-parallel built-in replica (ranks 1..N-1; rank 0 is the replica's server)."""

from __future__ import annotations

import os
import threading

from harness.seat import Seat


class RankActor:
    """Ray actor body for ranks 1..N-1 of a tensor-parallel replica (wrapped with ray.remote by ReplicaServer).

    It builds its shard from the replica's EngineConfig, joins rank 0's group at the
    replica's rendezvous address and replays its calls on a thread; if the group fails
    (rank 0 gone), the actor exits so nothing is left behind. It computes on the GPU of
    its own bundle (CUDA_VISIBLE_DEVICES holds exactly it; "" on CPU).
    """

    def __init__(self, engine_cfg: dict, rank: int, size: int, addr: str, port: int, secret: bytes,
                 loopback: bool, nice: int = 0):
        import ray

        from engine.config import EngineConfig
        from engine.tp.ranks import RankWorker

        self.rank, self.where = rank, Seat.here()
        os.environ["CUDA_VISIBLE_DEVICES"] = self.where.cuda_visible_devices  # before torch looks at CUDA
        cfg = EngineConfig(**engine_cfg)
        bind = "127.0.0.1" if loopback else ray.util.get_node_ip_address()  # this rank's own node

        def run() -> None:
            os.nice(nice)  # Linux: this thread (and those it starts), as rank 0's server is niced
            try:
                RankWorker(cfg, rank, size, addr, port, secret, bind).serve_forever()
            except BaseException:  # rank 0 vanished: nothing left to serve
                os._exit(1)

        threading.Thread(target=run, name=f"tp-rank{rank}", daemon=True).start()

    def ping(self) -> int:
        return os.getpid()

    def seat(self) -> dict:
        """Where this rank sits (harness/seat.py), with its rank."""
        return {"rank": self.rank, **self.where.to_json()}
