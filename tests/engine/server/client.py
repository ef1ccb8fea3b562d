"""A minimal HTTP client for the server tests: plain http.client, no project code on the wire."""

from __future__ import annotations

import http.client
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

REPO = Path(__file__).resolve().parents[3]
API_KEY = "test-key"
BASE_ARGS = ["--model-path", "random", "--model-preset", "tiny", "--host", "127.0.0.1", "--port", "0"]


@dataclass
class Reply:
    status: int
    headers: dict
    body: bytes

    def json(self):
        return json.loads(self.body)

    def events(self) -> list:
        """Server-sent events: JSON objects, or the string '[DONE]'."""
        out = []
        for block in self.body.decode().split("\n\n"):
            if not block.strip():
                continue
            assert block.startswith("data: "), block
            data = block[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
        return out


def parse_metrics(body: bytes) -> dict[str, float]:
    return {line.split()[0]: float(line.split()[1]) for line in body.decode().splitlines()
            if line and not line.startswith("#")}


class Server:
    """One `python -m engine.serve` subprocess and requests to it."""

    def __init__(self, args: list[str], log_path: Path, api_key: str | None = None, timeout: float = 90.0):
        self.api_key = api_key
        self.log_path = log_path
        cmd = [sys.executable, "-m", "engine.serve", *BASE_ARGS, *args]
        if api_key:
            cmd += ["--api-key", api_key]
        self.log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=self.log, text=True)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in self.proc.stdout], daemon=True).start()
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            self.stop()
            raise RuntimeError(f"server did not start: {self.log_tail()}") from None
        assert line.startswith("specgate engine serving on http://"), line
        self.url = line.split()[-1]
        u = urlparse(self.url)
        self.host, self.port = u.hostname, u.port
        deadline = time.monotonic() + timeout
        while self.call("GET", "/health").status != 200:
            assert time.monotonic() < deadline, "server never became healthy"
            time.sleep(0.1)

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def connect(self, timeout: float = 60.0) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def headers(self, auth: bool = True, extra: dict | None = None) -> dict:
        h = {"Content-Type": "application/json"}
        if auth and self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        h.update(extra or {})
        return h

    def call(self, method: str, path: str, body=None, raw: bytes | None = None, auth: bool = True,
             headers: dict | None = None, timeout: float = 60.0) -> Reply:
        """One request; `body` is sent as JSON, `raw` as is."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        conn = self.connect(timeout)
        try:
            conn.request(method, path, body=data, headers=self.headers(auth, headers))
            resp = conn.getresponse()
            return Reply(resp.status, dict(resp.getheaders()), resp.read())
        finally:
            conn.close()

    def generate(self, **body) -> dict:
        r = self.call("POST", "/generate", body)
        assert r.status == 200, r.body
        return r.json()

    def metrics(self) -> dict[str, float]:
        r = self.call("GET", "/metrics")
        assert r.status == 200, r.body
        return parse_metrics(r.body)

    def wait_idle(self, timeout: float = 20.0) -> dict[str, float]:
        """Poll /metrics until nothing runs or waits; returns the last metrics."""
        deadline = time.monotonic() + timeout
        while True:
            r = self.call("GET", "/metrics")
            if r.status == 503 and b"--max-connections" in r.body:
                # streams the client closed hold their slots until the server's next write to them fails
                assert time.monotonic() < deadline, f"server still at its connection cap after {timeout}s"
                time.sleep(0.05)
                continue
            assert r.status == 200, r.body
            m = parse_metrics(r.body)
            if m["specgate_num_running_reqs"] == 0 and m["specgate_num_queue_reqs"] == 0 \
                    and m["specgate_http_inflight_requests"] == 0:
                return m
            assert time.monotonic() < deadline, f"server still busy after {timeout}s: {m}"
            time.sleep(0.05)

    def flush(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while self.call("POST", "/flush_cache").status != 200:
            assert time.monotonic() < deadline, "flush_cache kept failing"
            time.sleep(0.1)

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def open_stream(server: Server, path: str, body: dict):
    """Start a streamed request; returns (connection, response, first event)."""
    conn = server.connect()
    conn.request("POST", path, body=json.dumps(body).encode(), headers=server.headers())
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    first = resp.readline()
    assert first.startswith(b"data: "), first
    return conn, resp, json.loads(first[len(b"data: "):])
