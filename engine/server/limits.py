"""Protection against floods: a cap on open connections, and one short log line per unparseable request.

Past the cap, a new connection gets a short 503 and is closed at once.

aiohttp has no such limit. Without one, idle sockets can use up the process's
open files, after which accept() fails in a loop (flooding the log) and even
/health stops answering. Idle connections are also closed by the keep-alive
timeout (`--keepalive-timeout`), so the cap only bites under a real flood.
"""

from __future__ import annotations

import json
import logging
import time

log = logging.getLogger("specgate.server")

_BODY = json.dumps({"error": {"message": "server: too many open connections (--max-connections); retry later",
                              "type": "server_error", "param": None, "code": 503}}).encode()
REJECT = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
          b"Content-Length: " + str(len(_BODY)).encode() + b"\r\n\r\n" + _BODY)
LOG_EVERY_S = 10.0


def cap_connections(server, limit: int) -> None:
    """Make aiohttp's low-level `server` (AppRunner.server) refuse connections beyond `limit`."""
    accept = server.connection_made
    state = {"rejected": 0, "logged": 0.0}

    def connection_made(handler, transport) -> None:
        accept(handler, transport)
        if len(server.connections) <= limit:
            return
        state["rejected"] += 1
        now = time.monotonic()
        if now - state["logged"] > LOG_EVERY_S:  # one line per interval, not one per connection
            state["logged"] = now
            log.warning("refusing connections past --max-connections %d (%d refused so far)", limit,
                        state["rejected"])
        transport.write(REJECT)
        transport.close()

    server.connection_made = connection_made


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
