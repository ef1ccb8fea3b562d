"""Replicas own their GPUs, on a fake-GPU Ray cluster (2 nodes x 4 logical GPUs: Ray places bundles and sets
CUDA_VISIBLE_DEVICES as on GPU nodes), with servers that record their environment (recording_server.py).

Each replica's server sees exactly the GPUs of its STRICT_PACK bundle, disjoint across replicas and pools; a plan
larger than the cluster exits 2 before any server starts; CPU replicas see CUDA_VISIBLE_DEVICES=""; the rank actors
of a tensor-parallel built-in replica each hold a GPU of their own, beside rank 0's. Placements are printed.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from harness.run import main
from reports.gate import EXIT_HARNESS_FAILED, EXIT_INCONCLUSIVE
from tests.harness.fake_vllm import make_interpreter
from tests.harness.helpers import REPO, make_sessions, write_workload

pytestmark = pytest.mark.slow
GPUS_PER_NODE = 4


@pytest.fixture(scope="module")
def gpu_cluster():
    """A head without GPUs and two nodes of 4 logical GPUs each; the test process is connected to it."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 0, "include_dashboard": False})
    for _ in range(2):
        cluster.add_node(num_cpus=4, num_gpus=GPUS_PER_NODE)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture
def run(tmp_path, monkeypatch):
    """`harness.run` in tmp_path with recording servers; returns (exit status, records by port, run directory)."""
    monkeypatch.chdir(REPO)  # the replicas run `python -m tests.harness.recording_server` from the driver's cwd
    envs = tmp_path / "envs"
    envs.mkdir()
    server = f"{sys.executable} -m tests.harness.recording_server --env-dir {envs}"

    def go(run_id: str, *argv: str) -> tuple[int, dict[int, dict], Path]:
        workload = write_workload(tmp_path / "w.jsonl", make_sessions(2))
        rc = main(["--suite", str(workload), "--concurrency", "1", "--runs-dir", str(tmp_path / "runs"), "--run-id",
                   run_id, "--server-command", server, "--no-progress", "--startup-timeout", "120", *argv])
        recorded = {int(f.stem): json.loads(f.read_text()) for f in envs.glob("*.json")}
        for f in envs.glob("*.json"):
            f.unlink()
        return rc, recorded, tmp_path / "runs" / run_id

    return go


@pytest.fixture
def sglang_model(tmp_path) -> str:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 300}))
    shutil.copy(REPO / "protocol" / "data" / "byte_tokenizer" / "tokenizer.json", model / "tokenizer.json")
    return str(model)


def replicas(run_dir: Path) -> list[tuple[str, dict]]:
    """(pool, replica entry of config.json) of every started replica."""
    pools = json.loads((run_dir / "config.json").read_text())["pools"]
    return [(name, r) for name, p in pools.items() for r in p["replicas"]]


def port_of(replica: dict) -> int:
    return int(replica["url"].rsplit(":", 1)[1])


def groups_since(before: set[str]) -> list[dict]:
    import ray

    return [g for pg_id, g in ray.util.placement_group_table().items() if pg_id not in before]


def test_managed_replicas_each_own_tp_gpus_disjoint_across_pools(gpu_cluster, run, sglang_model, tmp_path):
    """SGLang (a managed engine) at TP 2: the candidate, the calibration baseline and two reference replicas fill
    both nodes; each server's CUDA_VISIBLE_DEVICES is its own bundle's 2 GPUs."""
    import ray

    before = set(ray.util.placement_group_table())
    rc, recorded, run_dir = run("gpus", "--engine", "sglang", "--model", sglang_model, "--sglang-python",
                                make_interpreter(tmp_path / "bin"), "--tp-size", "2", "--calibrate",
                                "--reference-replicas", "2")
    assert rc == EXIT_INCONCLUSIVE, rc  # tiny turns exercise no boundary: the placement is what is checked
    placed = replicas(run_dir)
    assert sorted(p for p, _ in placed) == ["baseline", "reference", "reference", "sglang"]
    held = []
    for pool, r in placed:
        seat, env = r["placement"], recorded[port_of(r)]
        print(f"{pool} {r['replica_id']}: node {seat['node_id'][:8]}, GPUs {seat['gpu_ids']}, "
              f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']!r}, {seat['device']}")
        assert len(seat["gpu_ids"]) == 2 and env["CUDA_VISIBLE_DEVICES"] == seat["cuda_visible_devices"] == \
            ",".join(seat["gpu_ids"])
        assert env["argv"][env["argv"].index("--tp-size") + 1] == "2"
        held += [(seat["node_id"], g) for g in seat["gpu_ids"]]
    assert len(held) == len(set(held)) == 2 * GPUS_PER_NODE  # every GPU of the cluster, each held once
    groups = groups_since(before)
    assert len(groups) == 4 and all(g["strategy"] == "STRICT_PACK" and list(g["bundles"].values()) ==
                                    [{"CPU": 1.0, "GPU": 2.0}] for g in groups), groups


def test_a_plan_larger_than_the_cluster_exits_2_before_any_server_starts(gpu_cluster, run, sglang_model, tmp_path,
                                                                         capsys):
    rc, recorded, run_dir = run("too-big", "--engine", "sglang", "--model", sglang_model, "--sglang-python",
                                make_interpreter(tmp_path / "bin"), "--tp-size", "2", "--calibrate", "--replicas", "2",
                                "--reference-replicas", "2")
    err = capsys.readouterr().err
    print(err)
    assert rc == EXIT_HARNESS_FAILED and not recorded and not run_dir.exists()
    assert ("the plan does not fit the Ray cluster, so nothing was started: it needs 3 pool(s) (sglang, baseline, "
            "reference) x 2 replica(s) x TP 2 x 1 GPU per rank = 12 GPUs, 6 CPUs, each replica on one node; the "
            "cluster has 8 GPUs, 10 CPUs on 3 node(s)") in err


def test_a_directory_missing_on_a_replica_s_node_exits_2_before_any_server_starts(gpu_cluster, run, sglang_model,
                                                                                   tmp_path, capsys):
    missing = tmp_path / "drafters" / "none"
    rc, recorded, _ = run("no-drafter", "--engine", "sglang", "--model", sglang_model, "--sglang-python",
                          make_interpreter(tmp_path / "bin"), "--candidate-args",
                          f"--speculative-draft-model-path {missing}")
    err = capsys.readouterr().err
    assert rc == EXIT_HARNESS_FAILED and not recorded, err
    assert f"which hosts replica sglang-r0, has no {missing} (--speculative-draft-model-path in --candidate-args)" \
        in err and "nothing was started" in err


def test_cpu_replicas_see_no_gpu(gpu_cluster, run):
    rc, recorded, run_dir = run("cpu", "--device", "cpu", "--intervals", "16", "--block-size", "4")
    assert rc == EXIT_INCONCLUSIVE
    placed = replicas(run_dir)
    assert len(placed) == 2 and len(recorded) == 2
    for pool, r in placed:
        print(f"{pool} {r['replica_id']}: {r['placement']}")
        assert recorded[port_of(r)]["CUDA_VISIBLE_DEVICES"] == "" and "--device" not in recorded[port_of(r)]["argv"]
        assert r["placement"]["gpu_ids"] == [] and r["placement"]["device"] == "cpu"


def test_each_rank_actor_of_a_built_in_replica_holds_a_gpu_of_its_own(gpu_cluster, tmp_path, monkeypatch):
    """A TP 2 built-in replica in one bundle per rank: rank 0's server and the rank actor get different GPUs of
    one node (the rank actor joins the recording server's group as rank 1, on CPU)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from engine.config import EngineConfig
    from harness.placement import Devices, rank_bundles
    from harness.replica import ReplicaServer

    monkeypatch.chdir(REPO)
    envs = tmp_path / "envs"
    envs.mkdir()
    pg = placement_group(list(rank_bundles(2, Devices("cuda", 1.0))), strategy="STRICT_PACK")
    ray.get(pg.ready(), timeout=120)
    cfg = asdict(EngineConfig(model_path="random", model_preset="tiny", tp_size=2))  # the ranks compute on CPU here
    actor = ray.remote(num_cpus=1, num_gpus=1, max_restarts=0)(ReplicaServer).options(
        scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0)).remote(
        "i16-r0", ["--tp-size", "2"], (sys.executable, "-m", "tests.harness.recording_server", "--env-dir", str(envs)),
        str(REPO), 120.0, str(tmp_path / "logs"), cfg, "key", "loopback", None, None, 0, 1)
    try:
        seat = ray.get(actor.info.remote(), timeout=180)["placement"]
        (rank,) = seat["ranks"]
        print(f"rank 0: node {seat['node_id'][:8]}, GPUs {seat['gpu_ids']}; rank {rank['rank']}: node "
              f"{rank['node_id'][:8]}, GPUs {rank['gpu_ids']}")
        assert rank["rank"] == 1 and rank["node_id"] == seat["node_id"]
        assert len(seat["gpu_ids"]) == len(rank["gpu_ids"]) == 1 and seat["gpu_ids"] != rank["gpu_ids"]
        assert rank["cuda_visible_devices"] == rank["gpu_ids"][0]
        (env,) = [json.loads(f.read_text()) for f in envs.glob("*.json")]
        assert env["CUDA_VISIBLE_DEVICES"] == seat["gpu_ids"][0]
    finally:
        ray.get(actor.stop.remote(), timeout=60)
        ray.kill(actor, no_restart=True)
        remove_placement_group(pg)
