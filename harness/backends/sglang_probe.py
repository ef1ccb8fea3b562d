"""What an SGLang endpoint reports and can do: /server_info (or older builds' /get_server_info) and the probe.

The probe runs before a run writes anything (harness/run.py). It refuses, with
a message naming the server flag to set, what cannot be gated (a candidate
whose mamba strategy is not extra_buffer, a reference without top-2 log-probs),
and records in `specgate_probe` what it found and what the server cannot report
(spec_trace, candidate log-probs, cached_tokens), so the report can narrow.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp

from harness.backends.base import PROBE_KEY, ReplicaFailure, RequestError, probe_record
from harness.backends.info import block_size_of, candidate_problem, speculative, strategy_source, streaming_mode
from harness.backends.sglang_wire import TOP_K, check_status, generate_payload, headers, parse_answer

INFO_PATHS = ("/server_info", "/get_server_info")  # the second is SGLang's older (now deprecated) name
SECRET_KEYS = ("api_key", "admin_api_key")  # SGLang reports its server args, keys included
REDACTED = "<redacted>"


def redacted(info: dict, api_key: str | None) -> dict:
    """`info` without the server's keys: SGLang's /server_info holds `api_key` and `admin_api_key`, and its
    `launch_command` the `--api-key` value; what the run records (config.json) must not."""
    out = {k: (REDACTED if k in SECRET_KEYS and v else v) for k, v in info.items()}
    command = out.get("launch_command")
    if isinstance(command, str):
        for key in {api_key, *(info.get(k) for k in SECRET_KEYS)} - {None, ""}:
            command = command.replace(str(key), REDACTED)
        out["launch_command"] = command
    return out


async def _openai_hint(http: aiohttp.ClientSession, url: str, api_key: str | None) -> str:
    """A hint when `url` looks like an OpenAI-only server (GET /v1/models answers)."""
    try:
        async with http.get(f"{url}/v1/models", headers=headers(api_key),
                            timeout=aiohttp.ClientTimeout(total=10)) as resp:
            if resp.status == 200:
                return ("; GET /v1/models answers, so this is an OpenAI-compatible server (vLLM?): run with "
                        "--backend openai")
    except (aiohttp.ClientError, asyncio.TimeoutError):
        pass
    return "; is this an SGLang server (python -m sglang.launch_server, or python -m engine.serve)?"


async def fetch_server_info(http: aiohttp.ClientSession, url: str, api_key: str | None = None,
                            timeout: float = 10.0) -> tuple[dict, str]:
    """(settings, path they came from): GET /server_info, then /get_server_info if the first is 404/405.

    ReplicaFailure when the server is unreachable or broken; RequestError naming the URL when neither
    path exists (with a hint for OpenAI-only servers) or the server refuses (401: the API key).
    """
    tried = []
    for path in INFO_PATHS:
        try:
            async with http.get(f"{url}{path}", headers=headers(api_key),
                                timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                if resp.status in (404, 405):
                    tried.append(f"GET {path}: HTTP {resp.status}")
                    continue
                try:
                    await check_status(resp)
                except RequestError as e:
                    hint = " (pass the server's key with --api-key)" if resp.status == 401 else ""
                    raise RequestError(f"endpoint {url}: /server_info is not reachable ({e}){hint}") from None
                info = await resp.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
            raise ReplicaFailure(f"GET {url}{path} failed: {type(e).__name__}: {e}") from e
        if not isinstance(info, dict):
            raise ReplicaFailure(f"GET {url}{path} did not return a JSON object")
        return redacted(info, api_key), path
    hint = await _openai_hint(http, url, api_key)
    raise RequestError(f"endpoint {url}: neither /server_info nor /get_server_info exists ({', '.join(tried)})"
                       f"{hint}")


async def server_info(http: aiohttp.ClientSession, url: str, api_key: str | None = None,
                      timeout: float = 10.0) -> dict:
    """The server's settings (see fetch_server_info)."""
    return (await fetch_server_info(http, url, api_key, timeout))[0]


async def _probe_request(http: aiohttp.ClientSession, url: str, api_key: str | None, timeout: float):
    """One short greedy /generate: (raw answer, Generation)."""
    payload = dict(generate_payload("specgate-probe", [1, 2, 3, 4], 2, stream=False), rid=None)
    t0 = time.perf_counter()
    try:
        async with http.post(f"{url}/generate", json=payload, headers=headers(api_key),
                             timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            await check_status(resp)
            raw = await resp.json(content_type=None)
    except (ReplicaFailure, RequestError) as e:
        raise RequestError(f"endpoint {url}: the probe /generate request failed ({e})") from e
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
        raise RequestError(f"endpoint {url}: the probe /generate request failed ({type(e).__name__}: {e})") from e
    if not isinstance(raw, dict):
        raise RequestError(f"endpoint {url}: the probe /generate answer is not a JSON object")
    return raw, parse_answer(raw, None, None, time.perf_counter() - t0)


def _answer_checks(url: str, role: str, info: dict, raw: dict, gen) -> tuple[list[str], list[str], str]:
    """(unknown, notes, logprobs level) from the probe answer; RequestError where the role cannot do without."""
    unknown, notes = [], []
    if not gen.output_ids:
        raise RequestError(f"endpoint {url}: the probe request returned no output_ids")
    widths = [len(t) for t in gen.output_top_logprobs]
    width = min(widths) if widths and len(widths) == len(gen.output_ids) else 0
    has_logprobs = len(gen.output_logprobs) >= len(gen.output_ids)
    level = f"top-{TOP_K}" if has_logprobs and width >= TOP_K else ("chosen token only" if has_logprobs else "none")
    if role == "reference":  # the margin rule reads the reference's top-1/top-2 gap
        if not has_logprobs:
            raise RequestError(f"endpoint {url}: no meta_info.output_token_logprobs (the reference must support "
                               "return_logprob)")
        if width < TOP_K:
            raise RequestError(
                f"endpoint {url}: meta_info.output_top_logprobs has {width} entries per token; specgate needs "
                f">= {TOP_K} (top_logprobs_num: {TOP_K}) for the margin test")
    elif level != f"top-{TOP_K}":
        unknown.append("candidate_logprobs" if not has_logprobs else "candidate_top_logprobs")
        notes.append(f"candidate log-probs: {level}; the oracle falls back to tokens and the reference's margins")
    meta = raw.get("meta_info") or {}
    if "cached_tokens" not in meta:
        unknown.append("cached_tokens")
        notes.append("no meta_info.cached_tokens: restored checkpoints cannot be seen per request")
    if role == "candidate" and speculative(info) and gen.spec_trace is None:
        unknown.append("spec_trace")
        notes.append("no meta_info.spec_trace (specgate's extension): verify-step crossings are inferred")
    return unknown, notes, level


async def probe(http: aiohttp.ClientSession, url: str, api_key: str | None = None, role: str = "candidate",
                generate: bool = True, timeout: float = 60.0) -> dict:
    """The endpoint's settings checked for `role`, with its `specgate_probe` record (see the module doc)."""
    try:
        info, path = await fetch_server_info(http, url, api_key)
    except ReplicaFailure as e:
        raise RequestError(f"endpoint {url}: /server_info is not reachable ({e}); is the server running?") from e
    notes = []
    if path != INFO_PATHS[0]:
        notes.append(f"settings from {path} (an SGLang build without /server_info)")
    if strategy_source(info) == "mamba_scheduler_strategy":
        notes.append("strategy from mamba_scheduler_strategy (SGLang's name before mid-2026)")
    if role == "candidate":
        problem = candidate_problem(info, url)
        if problem:
            raise RequestError(problem)
        if info.get("speculative_dflash_block_size") and not info.get("speculative_num_draft_tokens"):
            notes.append("block size from speculative_dflash_block_size")
    unknown: list[str] = []
    level = None
    if generate:
        raw, gen = await _probe_request(http, url, api_key, timeout)
        unknown, more, level = _answer_checks(url, role, info, raw, gen)
        notes += more
    info = dict(info)
    info[PROBE_KEY] = probe_record("sglang", unknown, notes, role=role, settings_path=path,
                                   streaming=streaming_mode(info), block_size=block_size_of(info), logprobs=level)
    return info
