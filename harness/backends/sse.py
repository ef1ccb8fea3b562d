"""Server-sent events as both serving protocols stream them: `data:` events, a `[DONE]` sentinel, timings.

An event can be large (SGLang's cumulative streaming repeats every token's log-probs in every event), so
the reader is linear in the stream's size: each byte is normalised, searched and copied a bounded number
of times, however many reads an event arrives in.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import aiohttp

DONE = b"[DONE]"


class EventSplitter:
    """Cuts a byte stream into SSE events (blank-line separated; CRLF line ends read as LF).

    `feed` takes each read and returns the events it completed; `close` returns what is left (a last
    event the server closed without its blank line). The pending buffer is appended to, never rebuilt,
    and the separator search resumes where the last one stopped. `buffer`: the bytearray to keep the
    pending bytes in (a test passes an instrumented one).
    """

    def __init__(self, buffer: bytearray | None = None) -> None:
        self._buf = bytearray() if buffer is None else buffer
        self._start = 0  # the pending event begins here; _buf[:_start] was handed out
        self._searched = 0  # _buf[_start:_searched] holds no separator
        self._cr = False  # the last read ended in "\r": held back, its "\n" may open the next read

    def feed(self, data: bytes) -> list[bytearray]:
        """The events completed by `data`, oldest first (without their blank line)."""
        if self._cr:
            data = b"\r" + data
        self._cr = data.endswith(b"\r")
        if self._cr:
            data = data[:-1]
        buf = self._buf
        buf += data.replace(b"\r\n", b"\n")  # every CRLF pair lies within one read now: a whole-stream replace
        events = []
        while True:
            # a separator may straddle the previous end: resume one byte before it
            i = buf.find(b"\n\n", max(self._searched - 1, self._start))
            if i < 0:
                self._searched = len(buf)
                break
            events.append(buf[self._start:i])
            self._start = self._searched = i + 2
        if self._start and self._start >= len(buf) - self._start:  # drop what was handed out (amortised)
            del buf[:self._start]
            self._searched -= self._start
            self._start = 0
        return events

    def close(self) -> bytearray:
        """The bytes after the last separator (a held-back "\r" included)."""
        rest = self._buf[self._start:]
        if self._cr:
            rest += b"\r"
        return rest


async def sse_data(resp: aiohttp.ClientResponse) -> AsyncIterator[tuple[float, bytes]]:
    """(arrival time, payload) of every `data:` event, `[DONE]` included, as the bytes arrive; other lines skipped."""
    splitter = EventSplitter()
    now = time.perf_counter()
    async for data in resp.content.iter_any():
        now = time.perf_counter()
        for event in splitter.feed(data):
            if (body := _data(event)) is not None:
                yield now, body
    if (body := _data(splitter.close())) is not None:  # a last event the server closed without its blank line
        yield now, body


def _data(event: bytes | bytearray) -> bytes | None:
    """The payload of one event: its `data:` lines joined (other fields and comments dropped), or None."""
    if event.startswith(b"data:") and b"\n" not in event:  # one data line: what both protocols send
        return bytes(event[5:].strip())
    lines = [line[5:].strip() for line in event.strip().split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None  # bytes, also from bytearray lines


def stream_timing(t0: float, t_first: float | None, t_last: float | None, n: int) -> tuple[float | None, float | None]:
    """(TTFT, mean inter-token latency) of a stream sent at t0 whose first and last token chunks came at
    t_first and t_last, n output tokens in all (None where unknown)."""
    ttft = t_first - t0 if t_first is not None else None
    itl = (t_last - t_first) / (n - 1) if t_first is not None and t_last is not None and n > 1 else None
    return ttft, itl
