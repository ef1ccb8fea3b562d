"""Replicas of a pool are spread over the nodes of a (simulated) two-node Ray cluster."""

from __future__ import annotations

import pytest

from harness.run import main
from reports.gate import EXIT_INCONCLUSIVE
from tests.harness.helpers import check_complete, make_sessions, read_lines, run_args

pytestmark = pytest.mark.slow


def test_replicas_are_placed_on_both_nodes(workdir):
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=4)
        cluster.wait_for_nodes()
        sessions = make_sessions(4)
        rc = main(run_args(workdir, sessions, "--run-id", "nodes", "--address", cluster.address))
        # INCONCLUSIVE (exit 3), not PASS: so few short turns exercise too little (reports/exercised.py)
        assert rc == EXIT_INCONCLUSIVE
        nodes = {n.node_id for n in cluster.list_all_nodes()}
        cands = check_complete(workdir / "runs" / "nodes", sessions)
        for pool in ("i16", "i32"):
            placed = {r["replica_id"]: r["node_id"] for r in cands if r["pool"] == pool}
            assert len(placed) == 2 and set(placed.values()) == nodes, placed  # one replica on each node
        refs = [r for r in read_lines(workdir / "runs" / "nodes") if r["role"] == "reference"]
        assert {r["node_id"] for r in refs} <= nodes
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
