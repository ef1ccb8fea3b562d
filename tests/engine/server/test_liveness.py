"""A broken engine ends the server: a loop that raises or hangs fails in-flight requests with 503 (in-band, with a
503 code, once a stream has started) and the process exits 3, so that a supervisor restarts it; a hung loop reads
unhealthy on /health within seconds."""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.engine.server.client import Server, open_stream

pytestmark = pytest.mark.slow

LONG = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 1500, "ignore_eos": True}}


def in_thread(fn) -> tuple[threading.Thread, dict]:
    box: dict = {}
    t = threading.Thread(target=lambda: box.setdefault("value", fn()), daemon=True)
    t.start()
    return t, box


def test_a_loop_that_raises_fails_requests_with_503_and_exits_3(tmp_path):
    srv = Server(["--test-loop-fault", "raise-after:300"], tmp_path / "raise.log")
    try:
        conn, resp, first = open_stream(srv, "/generate", dict(LONG, rid="streamed", stream=True))
        t, box = in_thread(lambda: srv.call("POST", "/generate", dict(LONG, rid="plain")))
        rest = resp.read().decode()  # the stream ends once the loop died
        conn.close()
        events = [json.loads(b[len("data: "):]) if b != "data: [DONE]" else "[DONE]"
                  for b in rest.strip().split("\n\n")]
        err = events[-2]["error"]
        assert err["code"] == 503 and "test fault: the engine loop raised" in err["message"]
        t.join(30)
        plain = box["value"]
        assert plain.status == 503, plain.body
        assert srv.proc.wait(30) == 3
        log = srv.log_tail()
        assert "Traceback (most recent call last)" in srv.log_path.read_text()
        assert "engine died" in log and "exiting with status 3" in log
    finally:
        srv.stop()


def test_a_hung_loop_reads_unhealthy_within_seconds_then_the_server_exits_3(tmp_path):
    srv = Server(["--test-loop-fault", "hang-after:20", "--watchdog-timeout", "15"], tmp_path / "hang.log")
    try:
        assert srv.call("GET", "/health").status == 200
        t0 = time.monotonic()
        t, box = in_thread(lambda: srv.call("POST", "/generate", LONG, timeout=120))
        while srv.call("GET", "/health").status == 200:  # --heartbeat-timeout is 5 s by default
            assert time.monotonic() - t0 < 10, "a hung engine loop still reads healthy after 10 s"
            time.sleep(0.2)
        unhealthy_after = time.monotonic() - t0
        health = srv.call("GET", "/health").json()
        assert "engine loop stalled" in health["error"]["message"]
        assert srv.call("GET", "/metrics").status == 200  # and its gauge says so
        assert srv.metrics()["specgate_engine_healthy"] == 0
        t.join(60)
        reply = box["value"]
        assert reply.status == 503 and "--watchdog-timeout" in reply.json()["error"]["message"]
        assert srv.proc.wait(30) == 3
        print(f"/health unhealthy {unhealthy_after:.1f}s after the request that hangs the loop; "
              f"request failed and server exited after {time.monotonic() - t0:.1f}s")
    finally:
        srv.stop()


def test_idle_connections_are_capped_and_closed(tmp_path):
    srv = Server(["--max-connections", "8", "--keepalive-timeout", "1", "--client-timeout", "1"],
                 tmp_path / "cap.log")
    try:
        conns = [srv.connect() for _ in range(9)]
        answers = []
        for c in conns:
            c.connect()
        for c in conns:  # past the cap: 503 at once; under it: closed by the keep-alive timeout (1 s)
            c.sock.settimeout(10)
            answers.append(c.sock.recv(20))
        refused = [a for a in answers if a.startswith(b"HTTP/1.1 503")]
        assert len(refused) >= 1 and all(a == b"" for a in answers if a not in refused), answers
        assert srv.call("GET", "/health").status == 200
        slow = srv.connect()  # a body that never arrives: 408 after --client-timeout
        slow.putrequest("POST", "/generate")
        slow.putheader("Content-Type", "application/json")
        slow.putheader("Content-Length", "100")
        slow.endheaders(b'{"input_ids": [1')
        assert slow.getresponse().status == 408
        log_before = srv.log_path.stat().st_size
        garbage = srv.connect()
        garbage.connect()
        garbage.sock.sendall(b"\x00\x01\x02" * 50_000 + b"\r\n\r\n")
        garbage.sock.settimeout(10)
        assert garbage.sock.recv(100).startswith(b"HTTP/1.0 400")
        time.sleep(0.5)
        grown = srv.log_path.stat().st_size - log_before
        assert grown < 1000, f"one bad request logged {grown} bytes"
    finally:
        srv.stop()


def test_a_non_utf8_authorization_header_is_401(server):
    conn = server.connect()
    conn.connect()
    conn.sock.sendall(b"GET /server_info HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\r\n\r\n")
    resp = conn.sock.recv(200)
    conn.close()
    assert resp.startswith(b"HTTP/1.1 401"), resp
