"""The SGLang client reads incremental streams (only what is new per chunk) and cumulative ones (SGLang's
default) to the same answer, and classifies in-band errors: 5xx (an engine that died mid-stream) is the
replica's failure, to be re-sent; 4xx is the request's own."""

from __future__ import annotations

import asyncio
import dataclasses

import aiohttp
import pytest

from harness.backends import ReplicaFailure, RequestError
from harness.backends import sglang as client
from harness.backends.sglang_probe import server_info
from tests.harness.helpers import fake_servers

SERVER = ["--speculative-algorithm", "DFLASH", "--speculative-num-draft-tokens", "4", "--mamba-track-interval", "16"]


def test_incremental_and_cumulative_streams_read_to_the_same_answer():
    async def scenario():
        async with fake_servers(SERVER, [*SERVER, "--incremental"]) as (cumulative, incremental), \
                aiohttp.ClientSession() as http:
            answers = []
            for url in (cumulative, incremental):
                info = await server_info(http, url)
                payload = client.generate_payload("r", list(range(40, 70)), 12, stream=True)
                answers.append(await client.generate(http, url, payload, 30,
                                                     incremental=info["incremental_streaming_output"]))
            return answers

    a, b = asyncio.run(scenario())
    timing = {"ttft": None, "itl": None, "e2e": 0.0, "ttst": None}
    assert dataclasses.replace(a, **timing) == dataclasses.replace(b, **timing)
    assert len(b.output_ids) == 12 and len(b.output_top_logprobs) == 12 and b.spec_trace and b.ttft is not None


def test_incremental_chunks_that_disagree_with_the_server_count_are_refused():
    async def scenario():
        async with fake_servers(SERVER) as (cumulative,), aiohttp.ClientSession() as http:
            payload = client.generate_payload("r", list(range(40, 70)), 6, stream=True)
            await client.generate(http, cumulative, payload, 30, incremental=True)  # it is not incremental

    with pytest.raises(RequestError, match="is the server really streaming incrementally"):
        asyncio.run(scenario())


@pytest.mark.parametrize("chunk,kind", [
    ({"error": {"message": "engine: engine loop failed", "code": 503}}, ReplicaFailure),
    ({"error": {"message": "engine died"}}, ReplicaFailure),
    ({"error": "something broke"}, ReplicaFailure),
    ({"error": {"message": "input_ids: bad", "code": 400}}, RequestError),
])
def test_in_band_errors_are_classified_by_their_code(chunk, kind):
    assert isinstance(client.stream_error(chunk), kind)


def test_a_normal_chunk_is_no_error():
    assert client.stream_error({"text": "error", "output_ids": [1], "meta_info": {}}) is None


class _Content:
    def __init__(self, chunks: list[bytes]):
        self.chunks = chunks

    async def iter_any(self):
        for c in self.chunks:
            yield c


@pytest.mark.parametrize("chunks,want", [
    ([b"data: 1\n\ndata: 2\n\n"], [b"1", b"2"]),
    ([b"data: 1\r\n\r\ndata: [DONE]\r\n\r\n"], [b"1", b"[DONE]"]),  # CRLF line ends (the SSE spec allows them)
    ([b"data: 1\r", b"\n\r\ndata: 2\r\n", b"\r\n"], [b"1", b"2"]),  # a CRLF split across chunks
    ([b": keep-alive\n\nevent: x\ndata: 1\n\n"], [b"1"]),  # comments and other fields are skipped
    ([b"data: 1\n\ndata: 2"], [b"1", b"2"]),  # a last event closed without its blank line
    ([b"da", b"ta: 1\n", b"\n"], [b"1"]),  # an event split across chunks
])
def test_sse_data_yields_every_data_event(chunks, want):
    import asyncio
    from types import SimpleNamespace

    from harness.backends.sse import sse_data

    async def collect():
        return [body async for _, body in sse_data(SimpleNamespace(content=_Content(chunks)))]

    assert asyncio.run(collect()) == want


class CountingBuffer(bytearray):
    """A pending buffer that counts the bytes the reader searches, copies out and moves."""

    searched = copied = moved = 0

    def find(self, sub, start=0, end=None):
        i = super().find(sub, start, len(self) if end is None else end)
        self.searched += (len(self) if i < 0 else i + len(sub)) - start
        return i

    def __getitem__(self, item):
        out = super().__getitem__(item)
        if isinstance(item, slice):
            self.copied += len(out)
        return out

    def __delitem__(self, item):
        before = len(self)
        super().__delitem__(item)
        self.moved += len(self)  # what stays is moved to the front
        assert len(self) < before


def feed_all(chunks: list[bytes], buffer: bytearray | None = None) -> list[bytes]:
    from harness.backends.sse import EventSplitter, _data

    splitter = EventSplitter(buffer)
    events = [e for c in chunks for e in splitter.feed(c)] + [splitter.close()]
    return [b for e in events if (b := _data(e)) is not None]


def event_stream(size: int) -> tuple[bytes, bytes]:
    body = b"{" + b"7" * (size - 2) + b"}"
    return body, b"data: " + body + b"\r\n\r\ndata: [DONE]\r\n\r\n"


@pytest.mark.parametrize("size,chunk", [(200_000, 1), (10_000_000, 1024), (1_000_000, 7)])
def test_the_reader_touches_each_byte_a_bounded_number_of_times(size, chunk):
    """A quadratic reader (re-copy and rescan the pending buffer per read) searches ~size**2 / (2 * chunk)
    bytes: 2e10 for the first case. Linear: every byte is searched at most twice and copied out once."""
    body, stream = event_stream(size)
    buf = CountingBuffer()
    got = feed_all([stream[i:i + chunk] for i in range(0, len(stream), chunk)], buf)
    assert got == [body, b"[DONE]"]
    n = len(stream)
    assert buf.searched <= 2 * n + 2 * (n // chunk + 1)
    assert buf.copied <= n
    assert buf.moved <= n


def test_the_reader_allocates_linearly_in_the_event_size():
    """Independent of the buffer: the sum over reads of the extra memory each read allocates (tracemalloc's
    peak) stays within a few times the stream; rebuilding the pending buffer per read allocates it again
    every time (~1,000x the stream here)."""
    import tracemalloc
    from types import SimpleNamespace

    from harness.backends.sse import sse_data

    body, stream = event_stream(2_000_000)
    chunks = [stream[i:i + 1024] for i in range(0, len(stream), 1024)]
    grown = []

    class Measured:
        async def iter_any(self):
            for c in chunks:
                current, peak = tracemalloc.get_traced_memory()
                grown.append(peak - current)
                tracemalloc.reset_peak()
                yield c

    async def collect():
        return [b async for _, b in sse_data(SimpleNamespace(content=Measured()))]

    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        got = asyncio.run(collect())
    finally:
        tracemalloc.stop()
    assert got == [body, b"[DONE]"]
    assert sum(grown) < 8 * len(stream)


@pytest.mark.parametrize("stream", [
    b"data: 1\r\n\r\ndata: 2\n\n",
    b"data: a\r\ndata: b\r\n\r\n: c\r\n\r\ndata: d",  # multi-line event, comment, unterminated last event
    b"\r\n\r\n\r\ndata: x\r\r\n\n\rdata: y\r\n",  # stray CRs, empty events
    b"data: 1\n\n\ndata: 2\n\n\n\n",
])
def test_every_chunking_reads_like_one_read(stream):
    """Whatever the read boundaries (every split into two and 1-byte reads), the events are those of the
    stream read at once, which are those of the SSE split on the CRLF-normalised stream."""
    whole = feed_all([stream])
    norm = stream.replace(b"\r\n", b"\n").split(b"\n\n")
    from harness.backends.sse import _data

    assert whole == [b for e in norm if (b := _data(e)) is not None]
    for k in range(len(stream) + 1):
        assert feed_all([stream[:k], stream[k:]]) == whole, k
    assert feed_all([stream[i:i + 1] for i in range(len(stream))]) == whole
