"""The SGLang backend: /generate (streamed or not), /server_info, /flush_cache, /health, the probe."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp

from harness.backends import ReplicaFailure, RequestError
from records.schema import Generation

TOP_K = 2  # top logprobs per token the margin test needs (top-1 vs top-2)


def generate_payload(rid: str, input_ids: list[int], max_new_tokens: int, stream: bool) -> dict:
    """The /generate body: greedy, fixed length, logprobs with top-2."""
    return {
        "input_ids": input_ids,
        "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True},
        "rid": rid,
        "return_logprob": True,
        "top_logprobs_num": TOP_K,
        "stream": stream,
    }


def parse_answer(obj: dict, ttft: float | None, itl: float | None, e2e: float) -> Generation:
    """A Generation from one (final) SGLang answer object."""
    meta = obj.get("meta_info") or {}
    finish = meta.get("finish_reason")
    finish_type = finish.get("type") if isinstance(finish, dict) else finish
    abort = finish.get("message", "aborted") if isinstance(finish, dict) and finish_type == "abort" else None
    output_ids = [int(t) for t in obj.get("output_ids") or []]
    logprobs = [float(e[0]) for e in meta.get("output_token_logprobs") or []]
    top = [[[float(e[0]), int(e[1])] for e in tok] for tok in meta.get("output_top_logprobs") or []]
    trace = meta.get("spec_trace")
    verify_ct = meta.get("spec_verify_ct")
    accept = meta.get("spec_accept_length")
    if accept is None and verify_ct:
        accept = len(output_ids) / verify_ct
    return Generation(
        output_ids=output_ids,
        output_text=obj.get("text") or "",
        output_logprobs=logprobs,
        output_top_logprobs=top,
        cached_tokens=int(meta.get("cached_tokens") or 0),
        completion_tokens=int(meta.get("completion_tokens", len(output_ids))),
        finish_reason=finish_type,
        spec_verify_ct=verify_ct,
        spec_accept_length=accept,
        spec_trace=[list(map(int, s)) for s in trace] if trace is not None else None,
        ttft=ttft,
        itl=itl,
        e2e=e2e,
        abort_message=abort,
    )


def _headers(api_key: str | None) -> dict:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def _check_status(resp: aiohttp.ClientResponse) -> None:
    if resp.status < 400:
        return
    body = (await resp.text())[:300]
    if resp.status >= 500:
        raise ReplicaFailure(f"HTTP {resp.status}: {body}")
    raise RequestError(f"HTTP {resp.status}: {body}")


async def generate(session: aiohttp.ClientSession, url: str, payload: dict, timeout: float,
                   api_key: str | None = None) -> Generation:
    """POST /generate and return its final answer; streamed answers also give TTFT and mean ITL.

    Streamed snapshots are cumulative, so only the first chunk carrying tokens
    (for TTFT) and the last one (the answer) are parsed in full.
    """
    t0 = time.perf_counter()
    try:
        async with session.post(f"{url}/generate", json=payload, headers=_headers(api_key),
                                timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            await _check_status(resp)
            if not payload.get("stream"):
                obj = await resp.json(content_type=None)
                return parse_answer(obj, None, None, time.perf_counter() - t0)
            return await _read_stream(resp, t0)
    except asyncio.TimeoutError as e:
        raise RequestError(f"timeout after {timeout:g}s") from e
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
        raise ReplicaFailure(f"{type(e).__name__}: {e}") from e


async def _read_stream(resp: aiohttp.ClientResponse, t0: float) -> Generation:
    buf = b""
    last: bytes | None = None
    t_first = t_last = None
    done = False
    async for data in resp.content.iter_any():
        now = time.perf_counter()
        buf += data
        *events, buf = buf.split(b"\n\n")
        for event in events:
            event = event.strip()
            if not event.startswith(b"data:"):
                continue
            body = event[5:].strip()
            if body == b"[DONE]":
                done = True
                continue
            last = body
            t_last = now
            if t_first is None and json.loads(body).get("output_ids"):
                t_first = now
    if last is None:
        raise ReplicaFailure("stream ended without an answer")
    obj = json.loads(last)
    finish = (obj.get("meta_info") or {}).get("finish_reason")
    if not done and finish is None:
        raise ReplicaFailure("stream ended before the request finished")
    if isinstance(obj.get("error"), (str, dict)) and not obj.get("output_ids"):
        raise RequestError(f"server error: {obj['error']}")
    n = len(obj.get("output_ids") or [])
    ttft = t_first - t0 if t_first is not None else None
    itl = (t_last - t_first) / (n - 1) if t_first is not None and n > 1 else None
    return parse_answer(obj, ttft, itl, time.perf_counter() - t0)


async def health(session: aiohttp.ClientSession, url: str, timeout: float = 5.0) -> bool:
    """True when GET /health answers 200."""
    try:
        async with session.get(f"{url}/health", timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            return resp.status == 200
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return False


async def server_info(session: aiohttp.ClientSession, url: str, api_key: str | None = None,
                      timeout: float = 10.0) -> dict:
    """GET /server_info as a dict (ReplicaFailure when unreachable or not JSON)."""
    try:
        async with session.get(f"{url}/server_info", headers=_headers(api_key),
                               timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            await _check_status(resp)
            info = await resp.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
        raise ReplicaFailure(f"GET {url}/server_info failed: {type(e).__name__}: {e}") from e
    if not isinstance(info, dict):
        raise ReplicaFailure(f"GET {url}/server_info did not return a JSON object")
    return info


async def flush_cache(session: aiohttp.ClientSession, url: str, api_key: str | None = None,
                      wait: float = 60.0) -> None:
    """POST /flush_cache, retrying while the server answers 400 (requests still running)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            async with session.post(f"{url}/flush_cache", headers=_headers(api_key),
                                    timeout=aiohttp.ClientTimeout(total=30)) as resp:
                if resp.status < 300:
                    return
                detail = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                if resp.status >= 500:
                    raise ReplicaFailure(detail)
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            raise ReplicaFailure(f"POST {url}/flush_cache failed: {e}") from e
        if time.monotonic() > deadline:
            raise RequestError(f"POST {url}/flush_cache kept failing: {detail}")
        await asyncio.sleep(0.2)


async def probe(session: aiohttp.ClientSession, url: str, api_key: str | None = None,
                timeout: float = 60.0) -> dict:
    """Check that an external server can serve specgate; return its /server_info.

    Raises RequestError naming what is missing: /server_info, logprobs, or top-2 logprobs.
    """
    try:
        info = await server_info(session, url, api_key)
    except (ReplicaFailure, RequestError) as e:
        raise RequestError(f"endpoint {url}: /server_info is not reachable ({e})") from e
    payload = generate_payload("specgate-probe", [1, 2, 3, 4], 2, stream=False)
    try:
        gen = await generate(session, url, payload, timeout, api_key)
    except (ReplicaFailure, RequestError) as e:
        raise RequestError(f"endpoint {url}: the probe /generate request failed ({e})") from e
    if not gen.output_ids:
        raise RequestError(f"endpoint {url}: the probe request returned no output_ids")
    if len(gen.output_logprobs) < len(gen.output_ids):
        raise RequestError(f"endpoint {url}: no meta_info.output_token_logprobs "
                           "(the server must support return_logprob)")
    widths = [len(t) for t in gen.output_top_logprobs]
    if not widths or min(widths) < TOP_K:
        raise RequestError(
            f"endpoint {url}: meta_info.output_top_logprobs has {min(widths) if widths else 0} entries "
            f"per token; specgate needs >= {TOP_K} (top_logprobs_num: {TOP_K}) for the margin test")
    return info


async def metrics(session: aiohttp.ClientSession, url: str, api_key: str | None = None,
                  timeout: float = 10.0) -> str | None:
    """GET /metrics as Prometheus text; None when the server does not answer it (not exposed, down)."""
    try:
        async with session.get(f"{url}/metrics", headers=_headers(api_key),
                               timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            return await resp.text() if resp.status == 200 else None
    except (aiohttp.ClientError, asyncio.TimeoutError, UnicodeDecodeError):
        return None
