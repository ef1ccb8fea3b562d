"""A replica's health probe must be answered by its own server, not by whoever holds its port.

Two replicas started side by side can be handed one port by free_port(); the server that binds it first
answers the other replica's /health, and that replica reported its neighbour's URL as its own (seen once:
a candidate pool served by the reference server, INCONCLUSIVE with nothing restored). `holds_port` tells
the two apart through /proc, and `ReplicaServer._wait_healthy` refuses a port its server does not hold, so
that the replica starts again on another port.
"""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.ports import free_port, holds_port, listening_inodes, process_tree, shared_addresses
from harness.replica import ReplicaServer

needs_proc = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")
LISTENER = "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); " \
           "print(s.getsockname()[1], flush=True); time.sleep(120)"
PARENT = "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', sys.argv[1]]); p.wait()"
HEALTH = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def _spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", *args], stdout=subprocess.PIPE, text=True)


def _stop(*procs: subprocess.Popen) -> None:
    for p in procs:
        p.kill()
        p.wait()


@needs_proc
def test_the_listener_is_found_among_a_process_s_descendants_only():
    parent = _spawn(PARENT, LISTENER)  # the launcher's shape: the listening server is a child of the started pid
    other = _spawn("import time; time.sleep(120)")
    try:
        port = int(parent.stdout.readline())
        assert listening_inodes(port)
        assert len(process_tree(parent.pid)) == 2
        assert holds_port(parent.pid, port) is True
        assert holds_port(other.pid, port) is False  # alive, and another process visibly holds the port
        assert holds_port(parent.pid, free_port("127.0.0.1")) is None  # nobody listens there: nothing to tell
    finally:
        _stop(parent, other)


class _Fake:
    """The fields ReplicaServer._wait_healthy reads."""

    def __init__(self, proc: subprocess.Popen, port: int, log: Path) -> None:
        self._proc, self.port, self.url, self.log_path = proc, port, f"http://127.0.0.1:{port}", log


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@needs_proc
def test_a_port_another_server_answers_on_is_refused(tmp_path):
    decoy = http.server.HTTPServer(("127.0.0.1", 0), _Health)  # the neighbour that bound the port first
    threading.Thread(target=decoy.serve_forever, daemon=True).start()
    ours = _spawn("import time; time.sleep(120)")  # our server, still starting (it would fail to bind)
    try:
        t0 = time.monotonic()
        error = ReplicaServer._wait_healthy(_Fake(ours, decoy.server_port, tmp_path / "log"), 30)
        assert f"port {decoy.server_port} answers /health but another process holds it" in error
        assert time.monotonic() - t0 < 10  # refused at the first answer, not after the timeout
    finally:
        decoy.shutdown()
        _stop(ours)


@needs_proc
def test_a_server_that_holds_its_port_is_healthy(tmp_path):
    port = free_port("127.0.0.1")
    ours = _spawn(HEALTH, str(port))
    try:
        assert ReplicaServer._wait_healthy(_Fake(ours, port, tmp_path / "log"), 30) == ""
    finally:
        _stop(ours)


def test_two_replicas_reporting_one_address_are_refused():
    assert shared_addresses({"i128-r0": "http://127.0.0.1:4000", "reference-r0": "http://127.0.0.1:4001"}) is None
    problem = shared_addresses({"i128-r0": "http://127.0.0.1:4000", "i256-r0": "http://127.0.0.1:4002",
                                "reference-r0": "http://127.0.0.1:4000"})
    assert "replicas i128-r0 and reference-r0 both report http://127.0.0.1:4000" in problem


def _fake_proc(root: Path, holder: int | None) -> Path:
    """A /proc with a socket listening on port 4242 (inode 777): processes 10, its child 11, and 20; `holder` has
    the socket open, the others an unrelated one."""
    (root / "net").mkdir(parents=True)
    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    (root / "net" / "tcp").write_text(head + "   0: 0100007F:1092 00000000:0000 0A 00000000:00000000 00:00000000 "
                                      "00000000     0        0 777 1 0 100 0 0 10 0\n")
    (root / "net" / "tcp6").write_text(head)
    for pid, ppid in ((10, 1), (11, 10), (20, 1)):
        (root / str(pid) / "fd").mkdir(parents=True)
        (root / str(pid) / "stat").write_text(f"{pid} (python) S {ppid} 0 0\n")
        (root / str(pid) / "fd" / "3").symlink_to("socket:[777]" if pid == holder else "socket:[5]")
    return root


@pytest.mark.parametrize("holder,held", [(11, True), (20, False), (None, None)])
def test_who_holds_the_listening_socket(tmp_path, holder, held):
    """Our tree (a child of the started process) holds it: True; another process visibly: False; nobody we can
    see (a container's forwarded port, another user's process): None, the health answer taken as it comes."""
    assert holds_port(10, 4242, _fake_proc(tmp_path / "proc", holder)) is held
