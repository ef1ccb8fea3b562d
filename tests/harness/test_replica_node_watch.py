"""Issue 27, finding 4, without Ray: an actor whose raylet died is re-parented and lives on (the finding: the
reference actor's parent became PID 1 and its server answered /health until the cluster shut down), so a replica
watches its parent process and, once it is gone, stops its server and exits (ReplicaServer._watch_node).

A fake raylet (a parent process) starts the "actor": a child that watches its parent as ReplicaServer does,
with a server subprocess (a sleeper). The fake raylet is SIGKILLed; the actor and its server must both be gone
within seconds. test_replica_lifetime.py does the same with a real raylet on a two-node Ray cluster, where the
Ray version here also ends the worker itself; this test pins the replica's own part."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.test_replica_lifetime import alive, gone_within, parent_of

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
REPO = Path(__file__).resolve().parents[2]

ACTOR = """
import subprocess, sys, time
from harness.replica import ReplicaServer

class Replica:  # the fields _watch_node uses, and a server to stop
    replica_id, _stopping = "watch", False

    def __init__(self):
        self.server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                       stdout=subprocess.DEVNULL)

    def _terminate(self):
        self.server.terminate()
        self.server.wait()

r = Replica()
ReplicaServer._watch_node(r)
print(r.server.pid, flush=True)
time.sleep(600)
"""
RAYLET = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', sys.argv[1]]).wait()"


def test_an_actor_whose_raylet_dies_stops_its_server_and_exits():
    raylet = subprocess.Popen([sys.executable, "-c", RAYLET, ACTOR], cwd=REPO, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    pids: list[int] = []
    try:
        line = raylet.stdout.readline()  # "" once the actor exited without starting to watch
        assert line.strip(), "the actor did not start watching its raylet"
        server = int(line)
        actor = parent_of(server)
        pids += [server, actor]
        assert parent_of(actor) == raylet.pid and alive(server)
        raylet.send_signal(signal.SIGKILL)
        raylet.wait()
        assert gone_within(pids, 20), f"server {server} or actor {actor} outlived the raylet"
    finally:
        raylet.kill()
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
