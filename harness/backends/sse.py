"""Server-sent events as both serving protocols stream them: `data:` events, a `[DONE]` sentinel, timings."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import aiohttp

DONE = b"[DONE]"


async def sse_data(resp: aiohttp.ClientResponse) -> AsyncIterator[tuple[float, bytes]]:
    """(arrival time, payload) of every `data:` event, `[DONE]` included, as the bytes arrive; other lines skipped."""
    buf = b""
    now = time.perf_counter()
    async for data in resp.content.iter_any():
        now = time.perf_counter()
        buf = (buf + data).replace(b"\r\n", b"\n")  # the SSE spec allows CRLF line ends (even split in two)
        *events, buf = buf.split(b"\n\n")
        for event in events:
            if (body := _data(event)) is not None:
                yield now, body
    if (body := _data(buf)) is not None:  # a last event the server closed without its blank line
        yield now, body


def _data(event: bytes) -> bytes | None:
    """The payload of one event: its `data:` lines joined (other fields and comments dropped), or None."""
    lines = [line[5:].strip() for line in event.strip().split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


def stream_timing(t0: float, t_first: float | None, t_last: float | None, n: int) -> tuple[float | None, float | None]:
    """(TTFT, mean inter-token latency) of a stream sent at t0 whose first and last token chunks came at
    t_first and t_last, n output tokens in all (None where unknown)."""
    ttft = t_first - t0 if t_first is not None else None
    itl = (t_last - t_first) / (n - 1) if t_first is not None and t_last is not None and n > 1 else None
    return ttft, itl
