"""The Ray cluster's nodes as the harness sees them: what each has, which node holds a placement group, and whether
the directories a replica's server reads (its model, its drafter) are there before any server starts."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from harness.errors import HarnessError


@dataclass(frozen=True)
class Node:
    """One alive node: its id, address and total resources."""

    node_id: str
    address: str
    resources: dict[str, float]

    @property
    def name(self) -> str:
        """How messages name it: its address and the start of its id (nodes of one machine share an address)."""
        return f"{self.address} ({self.node_id[:8]})"


def local_gpus() -> int:
    """The GPUs a local Ray on this machine would find: those CUDA_VISIBLE_DEVICES names, else nvidia-smi's (0
    without it)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU ") for line in out.splitlines())


def alive_nodes() -> list[Node]:
    """The cluster's alive nodes, by id."""
    import ray

    return sorted((Node(n["NodeID"], n.get("NodeManagerAddress", "?"), dict(n.get("Resources", {})))
                   for n in ray.nodes() if n.get("Alive")), key=lambda n: n.node_id)


def group_node(pg) -> str:
    """The node that holds bundle 0 of a ready placement group (the replica actor's node)."""
    from ray.util import placement_group_table

    return placement_group_table(pg)["bundles_to_node_id"][0]


def missing_paths(paths: Sequence[str]) -> list[str]:
    """Those of `paths` that do not exist here (run as a Ray task on the node checked)."""
    return [p for p in paths if not os.path.exists(os.path.expanduser(p))]


def check_paths(needs: Sequence[tuple[str, str, tuple[tuple[str, str], ...]]], nodes: Sequence[Node]) -> None:
    """Each (replica id, node id, ((path, flag that named it), ...)) checked on its node, one task per node;
    HarnessError naming the node, the replica and the path when one is missing there."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    wanted: dict[str, set[str]] = {}
    for _, node_id, paths in needs:
        wanted.setdefault(node_id, set()).update(p for p, _ in paths)
    if not any(wanted.values()):
        return
    task = ray.remote(num_cpus=0)(missing_paths)
    refs = {node_id: task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))
            .remote(sorted(paths)) for node_id, paths in wanted.items() if paths}
    missing = dict(zip(refs, ray.get(list(refs.values()), timeout=120), strict=True))
    names = {n.node_id: n.name for n in nodes}
    for replica_id, node_id, paths in needs:
        for path, flag in paths:
            if path in missing.get(node_id, ()):
                raise HarnessError(f"node {names.get(node_id, node_id)}, which hosts replica {replica_id}, has no "
                                   f"{path} ({flag}): every node that hosts a replica needs the model and drafter "
                                   "directories at the same path (docs/cluster.md); nothing was started")
