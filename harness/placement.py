"""What a run's replicas compute on and reserve: the device (`--device`, `--gpus-per-rank`, resolved against the
cluster), the placement-group bundles of one replica, and whether the whole plan fits the cluster.

Every replica owns what it runs on, through its placement group (STRICT_PACK by default):

* a target whose tensor-parallel ranks the harness starts (the built-in engine: one Ray rank actor per rank)
  reserves one bundle per rank, `{"CPU": 1, "GPU": g}`; bundle 0 holds the replica actor and rank 0's server;
* a target that starts its own TP workers (SGLang, vLLM) reserves one bundle `{"CPU": 1, "GPU": tp * g}`, held
  by the replica actor, whose server inherits exactly those GPUs in CUDA_VISIBLE_DEVICES.

Ray gives a bundle's GPUs to its holder alone, so pools never share a GPU unless g is a fraction (built-in
replicas of one rank then share one). Pure functions: the Ray side is harness/ray_pools.py and harness/nodes.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from harness.errors import HarnessError

DEVICES = ("auto", "cpu", "cuda")  # --device


@dataclass(frozen=True)
class Devices:
    """Where a run's replicas compute, resolved: `kind` cpu or cuda, and the GPUs each TP rank reserves."""

    kind: str
    gpus_per_rank: float = 0.0

    @property
    def on_gpu(self) -> bool:
        return self.kind == "cuda"

    def describe(self, tp: int, own_ranks: bool) -> str:
        """What one replica reserves, in words (for --dry-run and messages)."""
        bundles = engine_bundles(tp, self) if own_ranks else rank_bundles(tp, self)
        shape = f"{len(bundles)} bundle(s) of {_bundle_text(bundles[0])}"
        return shape + (" (its TP workers are the server's own)" if own_ranks else " (one per TP rank)")


CPU = Devices("cpu")


def resolve_devices(device: str, gpus_per_rank: float | None, cluster_gpus: float) -> Devices:
    """--device and --gpus-per-rank against the cluster's GPUs: `auto` is cuda on a cluster with GPUs (unless
    --gpus-per-rank 0), else cpu; on cuda each rank reserves --gpus-per-rank GPUs, default 1. HarnessError when
    GPUs are asked of a cluster that has none."""
    if device == "cpu" or device == "auto" and (gpus_per_rank == 0 or gpus_per_rank is None and cluster_gpus <= 0):
        return CPU
    if cluster_gpus <= 0:
        asked = f"--device {device}" if device == "cuda" else f"--gpus-per-rank {gpus_per_rank:g}"
        raise HarnessError(f"{asked}: the Ray cluster has no GPUs; join a cluster that has them (--address), or run "
                           "on CPU (--device cpu)")
    return Devices("cuda", 1.0 if gpus_per_rank is None else float(gpus_per_rank))


def dry_run_devices(device: str, gpus_per_rank: float | None, local_gpus: int | None) -> list[Devices]:
    """The devices `--dry-run` shows (it joins no cluster): the one --device names; for `auto`, what this machine's
    GPUs (`local_gpus`, for a local Ray) resolve it to, or both, GPUs first, where the cluster is elsewhere (None)."""
    if device == "cuda" or device == "auto" and local_gpus is not None:
        return [resolve_devices(device, gpus_per_rank, 1 if device == "cuda" else local_gpus)]
    return [CPU] if device == "cpu" or gpus_per_rank == 0 else [resolve_devices(device, gpus_per_rank, 1), CPU]


def bundle(gpus: float) -> dict[str, float]:
    """One bundle: a CPU for its holder, and its GPUs where it has any (Ray refuses a resource of 0)."""
    return {"CPU": 1, "GPU": gpus} if gpus > 0 else {"CPU": 1}


def rank_bundles(tp: int, devices: Devices) -> tuple[dict[str, float], ...]:
    """A replica whose ranks the harness starts: one bundle per TP rank."""
    return tuple(bundle(devices.gpus_per_rank) for _ in range(tp))


def engine_bundles(tp: int, devices: Devices) -> tuple[dict[str, float], ...]:
    """A replica whose server starts its own TP workers: one bundle with all of their GPUs."""
    return (bundle(tp * devices.gpus_per_rank),)


def _bundle_text(b: Mapping[str, float]) -> str:
    return "{" + ", ".join(f'"{k}": {v:g}' for k, v in b.items()) + "}"


@dataclass(frozen=True)
class Demand:
    """What one pool's replicas reserve: `replicas` placement groups of `bundles` each."""

    pool: str
    replicas: int
    bundles: tuple[dict[str, float], ...]

    def total(self, resource: str) -> float:
        return self.replicas * sum(b.get(resource, 0) for b in self.bundles)


def _units(demands: Sequence[Demand], strategy: str) -> list[dict[str, float]]:
    """What must land on one node each: a whole replica under STRICT_PACK, else each bundle."""
    units = []
    for d in demands:
        for _ in range(d.replicas):
            if strategy == "STRICT_PACK":
                units.append({k: sum(b.get(k, 0) for b in d.bundles) for k in ("CPU", "GPU")})
            else:
                units += [dict(b) for b in d.bundles]
    return units


def fits(demands: Sequence[Demand], nodes: Mapping[str, Mapping[str, float]], strategy: str) -> bool:
    """Whether every unit (_units) finds a node with room, largest first (first fit decreasing)."""
    free = {name: {k: float(r.get(k, 0)) for k in ("CPU", "GPU")} for name, r in nodes.items()}
    for unit in sorted(_units(demands, strategy), key=lambda u: (-u.get("GPU", 0), -u.get("CPU", 0))):
        home = next((n for n, room in free.items() if all(room[k] >= unit.get(k, 0) - 1e-9 for k in room)), None)
        if home is None:
            return False
        for k in free[home]:
            free[home][k] -= unit.get(k, 0)
    return True


def plan_text(demands: Sequence[Demand], tp: int, devices: Devices) -> str:
    """The plan as pools x replicas x TP x g = what it reserves, e.g. `3 pools (i128, i256, reference) x 2 replicas
    x TP 2 x 1 GPU per rank = 12 GPUs, 12 CPUs`."""
    by_count: dict[int, list[str]] = {}
    for d in demands:
        by_count.setdefault(d.replicas, []).append(d.pool)
    if len(by_count) == 1:
        (count, names), = by_count.items()
        pools = f"{len(names)} pool(s) ({', '.join(names)}) x {count} replica(s)"
    else:
        pools = "(" + " + ".join(f"{', '.join(names)} x {count}" for count, names in by_count.items()) + \
            f" = {sum(d.replicas for d in demands)} replicas)"
    gpus, cpus = sum(d.total("GPU") for d in demands), sum(d.total("CPU") for d in demands)
    if not devices.on_gpu:
        return f"{pools} x TP {tp} on CPU = {cpus:g} CPUs"
    return f"{pools} x TP {tp} x {devices.gpus_per_rank:g} GPU per rank = {gpus:g} GPUs, {cpus:g} CPUs"


def cluster_text(nodes: Mapping[str, Mapping[str, float]]) -> str:
    """What the cluster has, in total and per node."""
    gpus = sum(r.get("GPU", 0) for r in nodes.values())
    cpus = sum(r.get("CPU", 0) for r in nodes.values())
    per_node = "; ".join(f"{name}: {r.get('GPU', 0):g} GPUs, {r.get('CPU', 0):g} CPUs" for name, r in nodes.items())
    return f"{gpus:g} GPUs, {cpus:g} CPUs on {len(nodes)} node(s) ({per_node})"


def misfit(demands: Sequence[Demand], nodes: Mapping[str, Mapping[str, float]], strategy: str, tp: int,
           devices: Devices) -> str | None:
    """Why the plan cannot be placed on the cluster's `nodes` (name -> total resources), None when it fits."""
    if fits(demands, nodes, strategy):
        return None
    where = "each replica on one node" if strategy == "STRICT_PACK" else f"bundles placed {strategy}"
    return (f"the plan does not fit the Ray cluster, so nothing was started: it needs "
            f"{plan_text(demands, tp, devices)}, {where}; the cluster has {cluster_text(nodes)}. Lower "
            "--replicas, --reference-replicas, --tp-size or --gpus-per-rank, or add nodes")
