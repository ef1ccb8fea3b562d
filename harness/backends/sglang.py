"""The SGLang backend: /generate (streamed or not), /flush_cache, /health; the probe is in sglang_probe.py, the
wire format both use in sglang_wire.py."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace

import aiohttp

from harness.backends.base import Backend, ReplicaFailure, RequestError
from harness.backends.sglang_probe import probe, server_info
from harness.backends.sglang_wire import TOP_K, check_status, generate_payload, headers, parse_answer, window_payload
from harness.backends.sse import DONE, sse_data, stream_timing
from records.schema import Generation

__all__ = ["TOP_K", "SGLangBackend", "StreamAssembly", "flush_cache", "generate", "generate_payload", "health",
           "parse_answer", "stream_error"]  # the wire format's names too: callers read them here

async def generate(session: aiohttp.ClientSession, url: str, payload: dict, timeout: float,
                   api_key: str | None = None, incremental: bool = False) -> Generation:
    """POST /generate and return its final answer; streamed answers also give TTFT and mean ITL.

    `incremental`: the server streams only what is new in each chunk (it says
    `incremental_streaming_output: true` in /server_info, as the built-in engine does and SGLang does with
    `--incremental-streaming-output`); otherwise chunks are SGLang's default cumulative snapshots.
    """
    t0 = time.perf_counter()
    try:
        async with session.post(f"{url}/generate", json=payload, headers=headers(api_key),
                                timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            await check_status(resp)
            if not payload.get("stream"):
                obj = await resp.json(content_type=None)
                return parse_answer(obj, None, None, time.perf_counter() - t0)
            return await _read_stream(resp, t0, incremental)
    except asyncio.TimeoutError as e:
        raise RequestError(f"timeout after {timeout:g}s") from e
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
        raise ReplicaFailure(f"{type(e).__name__}: {e}") from e


def stream_error(obj: dict) -> Exception | None:
    """The failure an in-band `{"error": ...}` chunk reports: a 4xx `code` is the request's own error, anything
    else (a 5xx code, as when the engine died mid-stream, or none) is the replica's."""
    err = obj.get("error")
    if not isinstance(err, (str, dict)):
        return None
    code = err.get("code") if isinstance(err, dict) else None
    message = err.get("message", err) if isinstance(err, dict) else err
    if isinstance(code, int) and 400 <= code < 500:
        return RequestError(f"server error {code}: {str(message)[:300]}")
    return ReplicaFailure(f"server error{f' {code}' if code else ''} mid-stream: {str(message)[:300]}")


class StreamAssembly:
    """Incremental chunks put together: ids, text, per-token logprobs and spec_trace steps concatenated."""

    LISTS = ("output_token_logprobs", "output_top_logprobs", "spec_trace")

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.text: list[str] = []
        self.lists: dict[str, list] = {k: [] for k in self.LISTS}
        self.meta: dict = {}

    def add(self, obj: dict) -> None:
        self.ids += obj.get("output_ids") or []
        self.text.append(obj.get("text") or "")
        meta = obj.get("meta_info") or {}
        for key, acc in self.lists.items():
            acc += meta.get(key) or []
        self.meta = meta

    def answer(self) -> dict:
        """The whole answer; RequestError if the chunks disagree with the server's own token count."""
        claimed = self.meta.get("completion_tokens")
        if claimed is not None and int(claimed) != len(self.ids):
            raise RequestError(f"incremental stream chunks hold {len(self.ids)} tokens but the server counts "
                               f"{claimed}: is the server really streaming incrementally?")
        meta = dict(self.meta)
        meta.update({k: v for k, v in self.lists.items() if k in self.meta or v})
        return {"text": "".join(self.text), "output_ids": self.ids, "meta_info": meta}


async def _read_stream(resp: aiohttp.ClientResponse, t0: float, incremental: bool = False) -> Generation:
    """The final answer of a server-sent-event stream. Cumulative chunks: only those up to the one that brings the
    second token (TTFT, time to second token) and the last one are parsed; incremental chunks are each parsed
    and put together."""
    last: dict | bytes | None = None
    assembly = StreamAssembly() if incremental else None
    t_first = t_last = t_second = None
    done = False
    async for now, body in sse_data(resp):
        if body == DONE:
            done = True
            continue
        obj = (json.loads(body) if assembly is not None or t_first is None or t_second is None or b'"error"' in body
               else None)
        if obj is not None and (failure := stream_error(obj)) is not None:
            raise failure
        t_last = now
        if assembly is not None:
            assembly.add(obj)
        last = obj if obj is not None else body
        if t_first is None and obj is not None and obj.get("output_ids"):
            t_first = now
        if t_second is None and obj is not None and len(assembly.ids if assembly is not None
                                                         else obj.get("output_ids") or ()) > 1:
            t_second = now  # one chunk may carry several tokens (DFlash): the second can come with the first
    if last is None:
        raise ReplicaFailure("stream ended without an answer")
    obj = assembly.answer() if assembly is not None else (last if isinstance(last, dict) else json.loads(last))
    finish = (obj.get("meta_info") or {}).get("finish_reason")
    if not done and finish is None:
        raise ReplicaFailure("stream ended before the request finished")
    ttft, itl = stream_timing(t0, t_first, t_last, len(obj.get("output_ids") or []))
    return replace(parse_answer(obj, ttft, itl, time.perf_counter() - t0),
                   ttst=t_second - t0 if t_second is not None else None)


async def health(session: aiohttp.ClientSession, url: str, timeout: float = 5.0) -> bool:
    """True when GET /health answers 200."""
    try:
        async with session.get(f"{url}/health", timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            return resp.status == 200
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return False


async def flush_cache(session: aiohttp.ClientSession, url: str, api_key: str | None = None,
                      wait: float = 60.0) -> None:
    """POST /flush_cache, retrying while the server answers 400 (SGLang's answer while requests still run).

    Any other 4xx is raised at once as a RequestError: a 401/403 (and a 404, which a server behind a proxy
    that checks keys may answer) with a hint about the API key; a 5xx or a lost connection is a ReplicaFailure.
    """
    deadline = time.monotonic() + wait
    while True:
        try:
            async with session.post(f"{url}/flush_cache", headers=headers(api_key),
                                    timeout=aiohttp.ClientTimeout(total=30)) as resp:
                if resp.status < 300:
                    return
                detail = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                if resp.status >= 500:
                    raise ReplicaFailure(detail)
                if resp.status in (401, 403, 404):
                    key = "the run's --api-key" if api_key else "no API key"
                    raise RequestError(f"POST {url}/flush_cache refused ({detail}); it was sent with {key}: pass "
                                       "the server's key with --api-key (SGLang's /flush_cache takes its "
                                       "--api-key or --admin-api-key)")
                if resp.status != 400:
                    raise RequestError(f"POST {url}/flush_cache refused ({detail})")
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            raise ReplicaFailure(f"POST {url}/flush_cache failed: {e}") from e
        if time.monotonic() > deadline:
            raise RequestError(f"POST {url}/flush_cache kept failing: {detail}")
        await asyncio.sleep(0.2)


class SGLangBackend(Backend):
    """SGLang's native API (`/generate` with input_ids and logprobs), as the built-in engine serves it too."""

    name = "sglang"

    async def server_info(self, http: aiohttp.ClientSession, url: str) -> dict:
        return await server_info(http, url, self.api_key)

    async def probe(self, http: aiohttp.ClientSession, url: str, role: str, generate: bool = True) -> dict:
        return await probe(http, url, self.api_key, role=role, generate=generate)

    def payload(self, input_ids: list[int], max_new_tokens: int, stream: bool) -> dict:
        return generate_payload("", input_ids, max_new_tokens, stream)

    def window_payload(self, input_ids: list[int], start: int) -> dict | None:
        return window_payload(input_ids, start)

    async def generate(self, http: aiohttp.ClientSession, url: str, payload: dict, timeout: float,
                       incremental: bool = False) -> Generation:
        return await generate(http, url, payload, timeout, self.api_key, incremental)

    async def flush(self, http: aiohttp.ClientSession, url: str, wait: float = 60.0) -> None:
        await flush_cache(http, url, self.api_key, wait)
