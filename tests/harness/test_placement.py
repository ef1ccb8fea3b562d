"""What replicas reserve and whether a plan fits the cluster (harness/placement.py): pure, no Ray."""

from __future__ import annotations

import pytest

from harness.errors import HarnessError
from harness.placement import (
    CPU,
    Demand,
    Devices,
    dry_run_devices,
    engine_bundles,
    fits,
    misfit,
    rank_bundles,
    resolve_devices,
)

GPU1 = Devices("cuda", 1.0)
NODES = {"a": {"CPU": 8, "GPU": 4}, "b": {"CPU": 8, "GPU": 4}}  # 2 nodes x 4 GPUs


@pytest.mark.parametrize(("device", "gpus_per_rank", "cluster_gpus", "expected"), [
    ("auto", None, 8, GPU1),  # a cluster with GPUs: one per rank
    ("auto", None, 0, CPU),
    ("auto", 0.25, 8, Devices("cuda", 0.25)),
    ("auto", 0, 8, CPU),  # --gpus-per-rank 0 keeps a GPU cluster's replicas on CPU
    ("cuda", None, 8, GPU1),
    ("cuda", 2, 8, Devices("cuda", 2.0)),
    ("cpu", None, 8, CPU),
])
def test_the_device_is_resolved_against_the_cluster(device, gpus_per_rank, cluster_gpus, expected):
    assert resolve_devices(device, gpus_per_rank, cluster_gpus) == expected


@pytest.mark.parametrize(("device", "gpus_per_rank", "flag"), [("cuda", None, "--device cuda"),
                                                               ("auto", 1, "--gpus-per-rank 1")])
def test_gpus_asked_of_a_cluster_without_any_are_refused(device, gpus_per_rank, flag):
    with pytest.raises(HarnessError, match=f"^{flag}: the Ray cluster has no GPUs"):
        resolve_devices(device, gpus_per_rank, 0)


def test_a_dry_run_shows_this_machine_s_device_or_both_for_a_cluster_elsewhere():
    assert dry_run_devices("auto", None, 0) == [CPU]  # a local Ray on this machine, which has no GPU
    assert dry_run_devices("auto", None, 2) == [GPU1]
    assert dry_run_devices("auto", None, None) == [GPU1, CPU]  # --address: not joined by a dry run
    assert dry_run_devices("cuda", 0.5, None) == [Devices("cuda", 0.5)]
    assert dry_run_devices("cpu", None, 8) == [CPU]


def test_rank_actors_get_a_bundle_each_and_a_managed_engine_one_bundle_with_every_gpu():
    assert rank_bundles(2, GPU1) == ({"CPU": 1, "GPU": 1.0}, {"CPU": 1, "GPU": 1.0})
    assert rank_bundles(2, CPU) == ({"CPU": 1}, {"CPU": 1})  # as before: no zero-valued resource
    assert engine_bundles(4, GPU1) == ({"CPU": 1, "GPU": 4.0},)
    assert engine_bundles(4, Devices("cuda", 2.0)) == ({"CPU": 1, "GPU": 8.0},)
    assert engine_bundles(4, CPU) == ({"CPU": 1},)


def test_strict_pack_keeps_a_replica_on_one_node():
    # 2 replicas of TP 4 (4 GPUs each) fill both nodes; a third does not fit, and neither does one of TP 8
    assert fits([Demand("sglang", 2, engine_bundles(4, GPU1))], NODES, "STRICT_PACK")
    assert not fits([Demand("sglang", 3, engine_bundles(4, GPU1))], NODES, "STRICT_PACK")
    assert not fits([Demand("sglang", 1, engine_bundles(8, GPU1))], NODES, "STRICT_PACK")
    # rank bundles may spread where the strategy allows: 8 ranks of one GPU over both nodes
    assert fits([Demand("i128", 1, rank_bundles(8, GPU1))], NODES, "PACK")
    assert not fits([Demand("i128", 1, rank_bundles(8, GPU1))], NODES, "STRICT_PACK")


def test_fractions_share_a_gpu_and_cpus_count_too():
    quarter, node = Devices("cuda", 0.25), {"a": {"CPU": 64, "GPU": 4}}
    assert fits([Demand("i128", 8, rank_bundles(1, quarter)), Demand("reference", 8, rank_bundles(1, quarter))],
                node, "STRICT_PACK")  # 16 replicas on 4 GPUs
    assert not fits([Demand("i128", 17, rank_bundles(1, quarter))], node, "STRICT_PACK")
    assert not fits([Demand("i128", 9, rank_bundles(1, CPU))], {"a": {"CPU": 8}}, "STRICT_PACK")


def test_a_plan_larger_than_the_cluster_is_named_beside_what_the_cluster_has():
    demands = [Demand(p, 2, rank_bundles(2, GPU1)) for p in ("i128", "i256", "reference")]
    message = misfit(demands, NODES, "STRICT_PACK", 2, GPU1)
    print(message)
    assert message == (
        "the plan does not fit the Ray cluster, so nothing was started: it needs 3 pool(s) (i128, i256, reference) "
        "x 2 replica(s) x TP 2 x 1 GPU per rank = 12 GPUs, 12 CPUs, each replica on one node; the cluster has 8 "
        "GPUs, 16 CPUs on 2 node(s) (a: 4 GPUs, 8 CPUs; b: 4 GPUs, 8 CPUs). Lower --replicas, --reference-replicas, "
        "--tp-size or --gpus-per-rank, or add nodes")
    uneven = [Demand("sglang", 2, engine_bundles(4, GPU1)), Demand("reference", 1, engine_bundles(4, GPU1))]
    assert "it needs (sglang x 2 + reference x 1 = 3 replicas) x TP 4 x 1 GPU per rank = 12 GPUs, 3 CPUs" in \
        misfit(uneven, NODES, "STRICT_PACK", 4, GPU1)
    assert misfit(demands[:2], NODES, "STRICT_PACK", 2, GPU1) is None
    cpu = [Demand("i16", 3, rank_bundles(2, CPU))]
    assert "it needs 1 pool(s) (i16) x 3 replica(s) x TP 2 on CPU = 6 CPUs, each replica on one node; the cluster " \
        "has 8 GPUs, 4 CPUs on 1 node(s) (a: 8 GPUs, 4 CPUs)" in misfit(cpu, {"a": {"CPU": 4, "GPU": 8}},
                                                                      "STRICT_PACK", 2, CPU)
