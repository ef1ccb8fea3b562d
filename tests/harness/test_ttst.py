"""Time to second token in both stream readers: at the chunk that brings the second token, which under DFlash
can be the first chunk (several tokens in one)."""

from __future__ import annotations

import asyncio
import json
import time

from harness.backends import openai as openai_backend
from harness.backends import sglang as sglang_backend
from harness.backends.openai_parse import TokenMap


class FakeResponse:
    """What the readers use of an aiohttp response: `content.iter_any()`, one read per chunk, 5 ms apart."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.content = self
        self.chunks = chunks

    async def iter_any(self):
        for c in self.chunks:
            await asyncio.sleep(0.005)
            yield c


def sse(obj) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def sglang_chunks(sizes: list[int], incremental: bool) -> list[bytes]:
    out, ids = [], []
    for k, n in enumerate(sizes):
        new = list(range(65 + len(ids), 65 + len(ids) + n))
        ids += new
        last = k == len(sizes) - 1
        meta = {"completion_tokens": len(ids), "cached_tokens": 0,
                "finish_reason": {"type": "length", "length": len(ids)} if last else None}
        out.append(sse({"text": "", "output_ids": new if incremental else list(ids), "meta_info": meta}))
    return out + [sse(b"[DONE]")]


def openai_chunks(sizes: list[int]) -> list[bytes]:
    out, start = [], 65
    for k, n in enumerate(sizes):
        ids = list(range(start, start + n))
        start += n
        out.append(sse({"choices": [{"text": "x" * n, "token_ids": ids,
                                     "finish_reason": "length" if k == len(sizes) - 1 else None}]}))
    return out + [sse(b"[DONE]")]


def read_sglang(sizes: list[int], incremental: bool):
    async def go():
        return await sglang_backend._read_stream(FakeResponse(sglang_chunks(sizes, incremental)),
                                                 time.perf_counter(), incremental)
    return asyncio.run(go())


def read_openai(sizes: list[int]):
    async def go():
        return await openai_backend._read_stream(FakeResponse(openai_chunks(sizes)), time.perf_counter(),
                                                 TokenMap("byte"))
    return asyncio.run(go())


def test_second_token_in_a_later_chunk():
    for gen in (read_sglang([1, 1, 2], False), read_sglang([1, 1, 2], True), read_openai([1, 1, 2])):
        assert gen.output_ids == [65, 66, 67, 68]
        assert 0 < gen.ttft < gen.ttst < gen.e2e  # one chunk later, 5 ms on


def test_second_token_with_the_first_chunk():
    for gen in (read_sglang([3, 1], False), read_sglang([3, 1], True), read_openai([3, 1])):
        assert gen.ttst == gen.ttft  # several tokens in one chunk: the second came with the first


def test_one_token_answer_has_no_second_token():
    for gen in (read_sglang([1], False), read_openai([1])):
        assert gen.ttst is None and gen.ttft is not None
