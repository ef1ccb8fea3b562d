"""Server-sent events as both serving protocols stream them: `data:` events, a `[DONE]` sentinel, timings."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import aiohttp

DONE = b"[DONE]"


async def sse_data(resp: aiohttp.ClientResponse) -> AsyncIterator[tuple[float, bytes]]:
    """(arrival time, payload) of every `data:` event, `[DONE]` included, as the bytes arrive; other lines skipped."""
    buf = b""
    async for data in resp.content.iter_any():
        now = time.perf_counter()
        buf += data
        *events, buf = buf.split(b"\n\n")
        for event in events:
            event = event.strip()
            if event.startswith(b"data:"):
                yield now, event[5:].strip()


def stream_timing(t0: float, t_first: float | None, t_last: float | None, n: int) -> tuple[float | None, float | None]:
    """(TTFT, mean inter-token latency) of a stream sent at t0 whose first and last token chunks came at
    t_first and t_last, n output tokens in all (None where unknown)."""
    ttft = t_first - t0 if t_first is not None else None
    itl = (t_last - t_first) / (n - 1) if t_first is not None and t_last is not None and n > 1 else None
    return ttft, itl
