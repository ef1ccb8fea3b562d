"""--drivers 2 with the built-in engine (fp32: outputs exact and batch invariant) on a 2-node local Ray cluster:
frozen-suite sessions in a closed loop give the records of one driver, token for token; a driver actor killed
mid-run and a --resume give them too, with no key missing and none twice."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from harness.run import main
from reports.gate import EXIT_HARNESS_FAILED
from tests.harness.helpers import REPO, frozen_subset, read_lines

pytestmark = pytest.mark.slow
SESSIONS = ("frozen-i128-k1-m8", "frozen-i128-k1-m2", "frozen-i128-k1-p0", "frozen-i128-multi1",
            "frozen-i128-shared-stem", "frozen-i128-k2-m5")


@pytest.fixture(scope="module")
def two_nodes():
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "include_dashboard": False})
    cluster.add_node(num_cpus=4)
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def _args(tmp_path, *extra: str) -> list[str]:
    suite = frozen_subset(tmp_path / "frozen-subset.jsonl", SESSIONS)
    return ["--suite", suite, "--intervals", "128", "--concurrency", "4", "--runs-dir", str(tmp_path / "runs"),
            "--no-progress", "--min-coverage", "0", "--startup-timeout", "300", *extra]


def _outputs(run_dir) -> dict[str, tuple]:
    """key -> (error, output ids) of every candidate and reference record; asserts no key is stored twice."""
    recs = [r for r in read_lines(run_dir) if r["role"] in ("candidate", "reference")]
    twice = [k for k, n in Counter(r["key"] for r in recs).items() if n > 1]
    assert not twice, f"keys stored twice: {twice}"
    return {r["key"]: (r["error"], r["output_ids"]) for r in recs}


def test_two_driver_actors_give_one_drivers_records_and_survive_a_killed_actor(two_nodes, tmp_path, monkeypatch,
                                                                              capsys):
    import ray

    monkeypatch.chdir(REPO)
    assert main(_args(tmp_path, "--run-id", "one", "--drivers", "1")) in (0, 3)
    one = _outputs(tmp_path / "runs" / "one")
    turns = sum(1 for k in one if not k.startswith("ref/"))
    assert turns >= 12 and all(err is None for err, _ in one.values())

    assert main(_args(tmp_path, "--run-id", "two", "--drivers", "2")) in (0, 3)
    assert "driver actors: 2 on 2 node(s)" in capsys.readouterr().out  # SPREAD over the cluster's nodes
    assert _outputs(tmp_path / "runs" / "two") == one

    result = {}
    args = _args(tmp_path, "--drivers", "2")
    t = threading.Thread(target=lambda: result.setdefault("rc", main([*args, "--run-id", "cut"])))
    t.start()
    run_dir = tmp_path / "runs" / "cut"
    journal = run_dir / "drivers" / "d1" / "candidate-i128.jsonl"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and t.is_alive():
        if journal.exists() and journal.read_text().count("\n") >= 1:
            break
        time.sleep(0.05)
    ray.kill(ray.get_actor("specgate-driver-cut-d1"), no_restart=True)
    t.join(timeout=600)
    assert result.get("rc") == EXIT_HARNESS_FAILED
    cut = _outputs(run_dir)
    assert 0 < sum(not k.startswith("ref/") for k in cut) < turns  # killed mid-run, its records kept
    assert main([*args, "--resume", str(run_dir)]) in (0, 3)
    assert _outputs(run_dir) == one
