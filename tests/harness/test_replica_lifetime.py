"""A replica's server dies with its actor, whatever kills it (issue 27, finding 4): a SIGKILLed actor (the death
signal and the launcher's watchdog) and a killed node, its raylet SIGKILLed under a live actor (the actor sees
its parent gone, stops the server and exits). A real two-node local cluster (`ray.cluster_utils.Cluster`)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from harness.replica import http_ok
from tests.harness.helpers import FAKE_SERVER, REPO

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")]


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        worker = c.add_node(num_cpus=2)
        c.wait_for_nodes()
        ray.init(address=c.address, include_dashboard=False, log_to_driver=False)
        yield c, worker
    finally:
        if ray.is_initialized():
            ray.shutdown()
        c.shutdown()


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def alive(pid: int) -> bool:
    """Running (a zombie, gone but not yet reaped, counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def gone_within(pids: list[int], seconds: float) -> bool:
    t0 = time.monotonic()
    while any(alive(p) for p in pids):
        if time.monotonic() > t0 + seconds:
            return False
        time.sleep(0.2)
    print(f"pids {pids} gone after {time.monotonic() - t0:.1f}s")
    return True


def start_replica(node_id: str, log_dir: Path, name: str) -> tuple[object, dict, int]:
    """A replica actor pinned to `node_id` running the fake server; (actor, info, actor pid)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from harness.replica import ReplicaServer

    actor = ray.remote(max_restarts=0, num_cpus=1)(ReplicaServer).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(
        name, ["--speculative-algorithm", "NONE", "--disable-radix-cache"], FAKE_SERVER, str(REPO), 120.0,
        str(log_dir), None, "k", "loopback")
    info = ray.get(actor.info.remote(), timeout=180)
    return actor, info, parent_of(info["pid"])


def test_a_sigkilled_actor_takes_its_server_with_it(cluster, tmp_path):
    c, worker = cluster
    actor, info, actor_pid = start_replica(worker.node_id, tmp_path, "kill-actor")
    assert http_ok(f"{info['url']}/health")
    os.kill(actor_pid, signal.SIGKILL)
    assert gone_within([info["pid"]], 30), f"server {info['pid']} outlived its actor {actor_pid}"
    assert not http_ok(f"{info['url']}/health")


def test_a_killed_node_takes_the_servers_of_its_live_actors_with_it(cluster, tmp_path):
    """c76ee7a: the actor was re-parented to PID 1 and its server answered /health 200 until the cluster shut down."""
    from ray._private import ray_constants

    c, worker = cluster
    actor, info, actor_pid = start_replica(worker.node_id, tmp_path, "kill-node")
    raylet = worker.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process
    assert parent_of(actor_pid) == raylet.pid  # what the actor watches
    raylet.send_signal(signal.SIGKILL)
    raylet.wait()
    assert gone_within([info["pid"], actor_pid], 60), \
        f"server {info['pid']} (actor {actor_pid}) outlived its node's raylet"
    assert not http_ok(f"{info['url']}/health")


def test_a_port_held_by_something_that_is_not_http_is_not_healthy():
    """A port another process took between free_port() and the bind, answering bytes that are no HTTP status line:
    not healthy (and no exception), so the replica tries another port."""
    import socket
    import threading

    from harness.replica import http_ok

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)

    def answer() -> None:
        conn, _ = sock.accept()
        conn.recv(1024)
        conn.sendall(b"\x00\x01\xfe binary protocol\r\n\r\n")
        conn.close()

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    assert http_ok(f"http://127.0.0.1:{sock.getsockname()[1]}/health", timeout=5) is False
    thread.join(5)
    sock.close()
