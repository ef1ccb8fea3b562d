"""Protection against floods: a cap on open connections that keeps /health answering, and one short log line per
unparseable request.

aiohttp has no connection limit. Without one, idle sockets can use up the
process's open files, after which accept() fails in a loop (flooding the log)
and even /health stops answering. `CappedSite` listens like aiohttp's TCPSite but
decides, as each connection is made, who serves it: aiohttp while fewer than the
cap are open, else the `Overflow` gate. The gate reads only the request head:
`GET /health` gets the same answer as under the cap (so a busy, healthy server
does not read as failed to its load balancer or supervisor), anything else a
short 503, and the connection is closed. At most `OVERFLOW_RESERVE` connections
wait in the gate, each for at most `OVERFLOW_WAIT_S`; past that the oldest one
still silent is closed with a 503, so a flood holds at most cap + reserve open
files. Idle connections under the cap are closed by the keep-alive timeout
(`--keepalive-timeout`), so the cap only bites under a real flood.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable

from aiohttp import web

log = logging.getLogger("specgate.server")

_BODY = json.dumps({"error": {"message": "server: too many open connections (--max-connections); retry later",
                              "type": "server_error", "param": None, "code": 503}}).encode()
REASONS = {200: "OK", 503: "Service Unavailable"}
LOG_EVERY_S = 10.0
# A connection's request head reaches the gate one or two event-loop turns after the connection is made; up to one
# accept batch (TCPSite's backlog, 128) of newer connections may be made in between. The reserve is twice that, so
# that a flood cannot push a /health probe out before its request line is read.
OVERFLOW_RESERVE = 256
OVERFLOW_WAIT_S = 2.0  # seconds a connection past the cap may take to send its request head
MAX_HEAD_BYTES = 8192


def http_response(status: int, body: bytes, head_only: bool = False) -> bytes:
    """A complete HTTP/1.1 JSON response that closes the connection."""
    head = (f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\nContent-Type: application/json\r\n"
            f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    return head if head_only else head + body


REJECT = http_response(503, _BODY)


class OverflowGate:
    """The connections past the cap: /health is answered, anything else gets 503, none stays long."""

    def __init__(self, health: Callable[[], tuple[int, dict]], limit: int, reserve: int = OVERFLOW_RESERVE,
                 wait_s: float = OVERFLOW_WAIT_S):
        self.health, self.limit, self.reserve, self.wait_s = health, limit, reserve, wait_s
        self.waiting: OrderedDict[Overflow, None] = OrderedDict()  # oldest first
        self.refused = self.health_answered = 0
        self._logged = 0.0

    def admit(self, conn: Overflow) -> None:
        self.waiting[conn] = None
        if len(self.waiting) > self.reserve:  # the oldest silent one makes room
            next(iter(self.waiting)).refuse()
        now = time.monotonic()
        if now - self._logged > LOG_EVERY_S:  # one line per interval, not one per connection
            self._logged = now
            log.warning("connections past --max-connections %d: %d refused, %d /health answered so far", self.limit,
                        self.refused, self.health_answered)

    def release(self, conn: Overflow) -> None:
        self.waiting.pop(conn, None)


class Overflow(asyncio.Protocol):
    """One connection past the cap: reads the request head, answers it, closes."""

    def __init__(self, gate: OverflowGate):
        self.gate = gate
        self.transport: asyncio.Transport | None = None
        self.head = b""
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.timer = asyncio.get_running_loop().call_later(self.gate.wait_s, self.refuse)
        self.gate.admit(self)

    def data_received(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.head += data
        if b"\r\n\r\n" not in self.head:
            if len(self.head) > MAX_HEAD_BYTES:
                self.refuse()
            return
        parts = self.head.split(b"\r\n", 1)[0].split()
        if len(parts) == 3 and parts[0] in (b"GET", b"HEAD") and parts[1].split(b"?", 1)[0] == b"/health":
            status, body = self.gate.health()
            self.gate.health_answered += 1
            self._answer(http_response(status, json.dumps(body).encode(), head_only=parts[0] == b"HEAD"))
        else:
            self.refuse()

    def refuse(self) -> None:
        """Answer 503 (too many connections) and close, unless already answered."""
        if self.transport is not None and not self.transport.is_closing():
            self.gate.refused += 1
            self._answer(REJECT)

    def _answer(self, raw: bytes) -> None:
        self.gate.release(self)
        if self.timer is not None:
            self.timer.cancel()
        self.transport.write(raw)
        self.transport.close()

    def connection_lost(self, exc) -> None:
        self.gate.release(self)
        if self.timer is not None:
            self.timer.cancel()


class _Switch(asyncio.Protocol):
    """Chooses, as the connection is made (when the count of open ones is exact), the protocol that serves it."""

    def __init__(self, choose: Callable[[], asyncio.Protocol]):
        self.choose = choose

    def connection_made(self, transport) -> None:
        chosen = self.choose()
        transport.set_protocol(chosen)  # from here on the transport talks to `chosen` only
        chosen.connection_made(transport)


class CappedSite(web.TCPSite):
    """aiohttp's TCPSite with at most `limit` connections served by aiohttp; the others go to an OverflowGate."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, limit: int,
                 health: Callable[[], tuple[int, dict]]):
        super().__init__(runner, host, port)
        self.gate = OverflowGate(health, limit)

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner (what TCPSite.start does first)
        server = self._runner.server

        def choose() -> asyncio.Protocol:
            return server() if len(server.connections) < self.gate.limit else Overflow(self.gate)

        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Switch(choose), self._host, self._port, backlog=self._backlog,
            reuse_address=self._reuse_address, reuse_port=self._reuse_port)
        self._bound_port = self._server.sockets[0].getsockname()[1] if self._server.sockets else self._port


class CompactBadRequests(logging.Filter):
    """aiohttp logs a request it cannot parse with a traceback whose message repeats the raw bytes (a 150 KB
    garbage request gave a 500 KB log entry): keep one line with the first 200 characters instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import HttpProcessingError

        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            where = record.getMessage()[:100]
            record.msg, record.args = "%s: %s: %s", (where, type(exc).__name__, str(exc)[:200])
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def compact_bad_request_logs() -> None:
    """Install CompactBadRequests on aiohttp's server logger (once)."""
    logger = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, CompactBadRequests) for f in logger.filters):
        logger.addFilter(CompactBadRequests())
