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
    timing = {"ttft": None, "itl": None, "e2e": 0.0}
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
