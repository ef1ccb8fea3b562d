"""A connection flood at --max-connections: /health keeps answering 200, other requests get 503, and the server's
open files stay bounded (cap + overflow reserve). Real floods of real sockets against a real server."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections import deque

import pytest

from engine.server.limits import OVERFLOW_RESERVE
from tests.engine.server.client import Server, open_stream

pytestmark = pytest.mark.slow

CAP = 8
BUSY = {"input_ids": [5, 6, 7], "stream": True, "sampling_params": {"max_new_tokens": 1800, "ignore_eos": True}}


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def recv_all(sock: socket.socket, timeout: float = 10.0) -> bytes:
    sock.settimeout(timeout)
    chunks = []
    while chunk := sock.recv(4096):
        chunks.append(chunk)
    return b"".join(chunks)


@pytest.fixture
def capped(tmp_path):
    srv = Server(["--max-connections", str(CAP), "--max-running-requests", str(CAP)], tmp_path / "flood.log")
    yield srv
    srv.stop()


def test_a_busy_server_under_a_flood_answers_health_and_refuses_the_rest(capped):
    srv = capped
    idle_files = open_files(srv.proc.pid)
    busy = [open_stream(srv, "/generate", BUSY) for _ in range(CAP)]  # the cap is held by real work
    flood = [socket.create_connection((srv.host, srv.port)) for _ in range(3 * OVERFLOW_RESERVE)]
    try:
        for _ in range(20):  # each on a new connection, past the cap
            r = srv.call("GET", "/health")
            assert (r.status, r.json()) == (200, {"status": "ok"})
            assert r.headers["Connection"] == "close"
        r = srv.call("GET", "/health?probe=1", headers={"X-Probe": "lb"})
        assert r.status == 200
        r = srv.call("POST", "/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": 1}})
        assert r.status == 503 and "--max-connections" in r.json()["error"]["message"]
        r = srv.call("GET", "/server_info")
        assert r.status == 503
        files = open_files(srv.proc.pid)
        assert files <= idle_files + CAP + OVERFLOW_RESERVE + 8, (idle_files, files)
        # every flood connection past the cap is answered 503 and closed: evicted by newer ones, or after the wait
        answers = [recv_all(s) for s in flood]
        assert all(a.startswith(b"HTTP/1.1 503 Service Unavailable\r\n") for a in answers), \
            sorted({a[:40] for a in answers})
        assert json.loads(answers[0].split(b"\r\n\r\n", 1)[1])["error"]["code"] == 503
        for _conn, resp, _first in busy:  # the work under the cap went on meanwhile
            assert resp.readline() == b"\n" and resp.readline().startswith(b"data: {")
    finally:
        for s in flood:
            s.close()
        for conn, _, _ in busy:
            conn.close()
    srv.wait_idle(60)
    assert srv.generate(input_ids=[1, 2], sampling_params={"max_new_tokens": 2})["meta_info"]["completion_tokens"] == 2
    print(f"open files: {idle_files} idle, {files} with {CAP} busy streams and {3 * OVERFLOW_RESERVE} flood "
          f"connections")


def test_health_answers_while_a_flood_keeps_opening_connections(capped):
    srv = capped
    busy = [open_stream(srv, "/generate", BUSY) for _ in range(CAP)]
    stop = threading.Event()
    opened = [0]

    def churn() -> None:  # keeps 2 x reserve connections open, always replacing the oldest with a new one
        held: deque = deque()
        while not stop.is_set():
            try:
                held.append(socket.create_connection((srv.host, srv.port), timeout=5))
                opened[0] += 1
            except OSError:
                continue
            if len(held) > 2 * OVERFLOW_RESERVE:
                held.popleft().close()
        for s in held:
            s.close()

    flooders = [threading.Thread(target=churn, daemon=True) for _ in range(2)]
    for t in flooders:
        t.start()
    try:
        while opened[0] < 2 * OVERFLOW_RESERVE:
            time.sleep(0.01)
        statuses = [srv.call("GET", "/health").status for _ in range(50)]
        during = opened[0]
    finally:
        stop.set()
        for t in flooders:
            t.join(30)
        for conn, _, _ in busy:
            conn.close()
    assert statuses == [200] * 50
    print(f"50 /health probes, all 200, while {during} flood connections were opened")
