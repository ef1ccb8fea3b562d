"""The OpenAI backend (`--backend openai`): vLLM and other OpenAI-compatible servers, through /v1/completions.

Prompts go as token-id lists, greedy (`temperature 0`), fixed length (`ignore_eos`),
with `logprobs: 2` and vLLM's `return_token_ids`; cached tokens come from
`usage.prompt_tokens_details.cached_tokens` (vLLM: `--enable-prompt-tokens-details`).
Settings come from /server_info where the server has one (SGLang, the built-in
engine), else from vLLM's /metrics (metrics.py), else from the run's own flags
(`--intervals` with one value, `--block-size`), which the probe records as
declared. What the API cannot tell (spec_trace, per-request verify steps, and a
flush where the server has no /flush_cache or /reset_prefix_cache) is recorded
as unknown, so the report narrows.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, replace

import aiohttp

from harness.backends.base import PROBE_KEY, Backend, ReplicaFailure, RequestError, probe_record
from harness.backends.info import block_size_of
from harness.backends.metrics import fetch_samples, vllm_settings
from harness.backends.openai_parse import TOP_K, Answer, TokenMap, status_json
from harness.backends.openai_probe import check_answers, find_flush
from harness.backends.sglang_probe import fetch_server_info
from harness.backends.sse import DONE, sse_data, stream_timing
from records.schema import Generation
from reports.window import OPENAI_UNPROBED

VENDOR_FIELDS = ("ignore_eos", "return_token_ids")  # vLLM/SGLang extensions a strict OpenAI server refuses
ALWAYS_UNKNOWN = ("spec_trace", "spec_verify_ct")  # the OpenAI API reports no verify steps per request
# a setting the server does not report, taken from the run's flags or the endpoint's role: listed as unknown
DECLARED_AS = {"mamba_track_interval": "interval", "speculative_num_draft_tokens": "block_size",
               "speculative_algorithm": "speculative", "disable_radix_cache": "prefix_cache"}


@dataclass
class Endpoint:
    """What the probe learned about one URL."""

    model: str
    vendor_fields: bool = True
    flush_path: str | None = None
    tokens: TokenMap | None = None


class OpenAIBackend(Backend):
    name = "openai"
    window_unprobed = OPENAI_UNPROBED

    def __init__(self, api_key: str | None = None, tokenizer: str | None = None, defaults: dict | None = None):
        super().__init__(api_key, tokenizer, defaults)
        self.endpoints: dict[str, Endpoint] = {}

    # --- settings and probe --------------------------------------------------------------------
    async def _model(self, http: aiohttp.ClientSession, url: str) -> str:
        status, obj, head = await status_json(http, "GET", f"{url}/v1/models", self.headers())
        if status == 401:
            raise RequestError(f"endpoint {url}: GET /v1/models answered 401 (pass the server's key with --api-key)")
        data = obj.get("data") if isinstance(obj, dict) else None
        if status != 200 or not data or not isinstance(data[0], dict) or not data[0].get("id"):
            raise RequestError(f"endpoint {url}: GET /v1/models did not list a model (HTTP {status}: {head}); is "
                               "this an OpenAI-compatible server? (SGLang's native API: --backend sglang)")
        return str(data[0]["id"])

    async def _settings(self, http: aiohttp.ClientSession, url: str) -> tuple[dict, str, list[str]]:
        """(settings under SGLang's names, where from, notes): /server_info, else vLLM's /metrics, else none."""
        try:
            info, path = await fetch_server_info(http, url, self.api_key)
            if "vllm_config" not in info:  # vLLM's dev-mode /server_info is its config text: read /metrics
                return info, path, [f"settings from {path}"]
        except (RequestError, ReplicaFailure):
            pass
        info, notes = vllm_settings(await fetch_samples(http, url, self.headers()))
        return info, "/metrics" if info else "none", notes

    async def server_info(self, http: aiohttp.ClientSession, url: str) -> dict:
        return (await self._settings(http, url))[0]

    def _declare(self, info: dict, role: str, url: str) -> list[str]:
        """Fill settings the server does not report from the run's flags and the endpoint's role."""
        declared = []

        def put(key: str, value) -> None:
            if info.get(key) is None:
                info[key] = value
                declared.append(key)

        if role == "reference":
            put("speculative_algorithm", "NONE")
            put("disable_radix_cache", True)
            return declared
        put("speculative_algorithm", "UNREPORTED")
        put("disable_radix_cache", False)
        intervals = tuple(self.defaults.get("intervals") or ())
        if info.get("mamba_track_interval") is None and len(intervals) != 1:
            raise RequestError(
                f"endpoint {url}: the server reports no checkpoint interval (no /server_info, no "
                "vllm:cache_config_info in /metrics); declare it with --intervals N, one value (vLLM: its prefix "
                "cache block size, --block-size or --mamba-block-size)")
        put("mamba_track_interval", intervals[0] if intervals else None)
        if str(info.get("speculative_algorithm")).upper() != "NONE":
            put("speculative_num_draft_tokens", self.defaults.get("block_size"))
        return declared

    async def probe(self, http: aiohttp.ClientSession, url: str, role: str, generate: bool = True) -> dict:
        model = await self._model(http, url)
        info, source, notes = await self._settings(http, url)
        info = dict(info)
        declared = self._declare(info, role, url)
        if declared:
            notes.append(f"not reported by the server, taken from the run's flags and role: {', '.join(declared)}")
        endpoint = self.endpoints[url] = Endpoint(model, tokens=TokenMap(_token_source(self.tokenizer, info)))
        unknown = list(ALWAYS_UNKNOWN) if role == "candidate" else []
        unknown += [DECLARED_AS[k] for k in declared if k in DECLARED_AS]  # assumed, not known
        found: dict = {}
        if generate:
            more_unknown, more_notes, found = await check_answers(self, http, url, role, endpoint)
            unknown += more_unknown
            notes += more_notes
            if role == "candidate":
                endpoint.flush_path = await find_flush(self, http, url)
                if endpoint.flush_path is None:
                    unknown.append("flush")
                    notes.append("no /flush_cache or /reset_prefix_cache (vLLM: VLLM_SERVER_DEV_MODE=1): sweep points "
                                 "share the prefix cache")
            found["counters_before"] = await self.counters(http, url)
        info[PROBE_KEY] = probe_record("openai", unknown, notes, role=role, model=model, settings_path=source,
                                       declared=declared, streaming="openai deltas", flush=endpoint.flush_path,
                                       block_size=block_size_of(info), **found)
        return info

    # --- requests ----------------------------------------------------------------------------------
    def payload(self, input_ids: list[int], max_new_tokens: int, stream: bool) -> dict:
        return {"input_ids": list(input_ids), "max_new_tokens": max_new_tokens, "stream": stream}

    def body(self, endpoint: Endpoint, payload: dict) -> dict:
        """The /v1/completions body of a payload for `endpoint`."""
        body = {"model": endpoint.model, "prompt": payload["input_ids"], "max_tokens": payload["max_new_tokens"],
                "temperature": 0, "logprobs": TOP_K, "stream": payload["stream"]}
        if payload["stream"]:
            body["stream_options"] = {"include_usage": True}
        if endpoint.vendor_fields:
            body.update(ignore_eos=True, return_token_ids=True)
        return body

    async def generate(self, http: aiohttp.ClientSession, url: str, payload: dict, timeout: float,
                       incremental: bool = False) -> Generation:  # OpenAI streams are always incremental
        endpoint = self.endpoints.get(url) or Endpoint(await self._model(http, url), tokens=TokenMap(self.tokenizer))
        self.endpoints[url] = endpoint
        headers = dict(self.headers(), **({"X-Request-Id": payload["rid"]} if payload.get("rid") else {}))
        t0 = time.perf_counter()
        try:
            async with http.post(f"{url}/v1/completions", json=self.body(endpoint, payload), headers=headers,
                                 timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                if resp.status >= 400:
                    head = (await resp.text())[:300]
                    raise (ReplicaFailure if resp.status >= 500 else RequestError)(f"HTTP {resp.status}: {head}")
                if not payload["stream"]:
                    answer = Answer()
                    answer.absorb(await resp.json(content_type=None))
                    return answer.generation(endpoint.tokens, None, None, time.perf_counter() - t0)
                return await _read_stream(resp, t0, endpoint.tokens)
        except asyncio.TimeoutError as e:
            raise RequestError(f"timeout after {timeout:g}s") from e
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
            raise ReplicaFailure(f"{type(e).__name__}: {e}") from e

    async def flush(self, http: aiohttp.ClientSession, url: str, wait: float = 60.0) -> None:
        endpoint = self.endpoints.get(url)
        if endpoint is None or endpoint.flush_path is None:
            return  # the probe recorded that this server cannot be flushed
        deadline = time.monotonic() + wait
        while True:
            status, _, head = await status_json(http, "POST", f"{url}{endpoint.flush_path}", self.headers())
            if status < 300:
                return
            if status >= 500:
                raise ReplicaFailure(f"POST {url}{endpoint.flush_path}: HTTP {status}: {head}")
            if time.monotonic() > deadline:
                raise RequestError(f"POST {url}{endpoint.flush_path} kept failing: HTTP {status}: {head}")
            await asyncio.sleep(0.2)


def _token_source(cli_tokenizer: str | None, info: dict) -> str | None:
    """The tokenizer to map token strings with: --tokenizer, else the server's tokenizer_path if it is local."""
    from pathlib import Path

    if cli_tokenizer:
        return cli_tokenizer
    path = info.get("tokenizer_path")
    if path and Path(str(path)).expanduser().exists():
        return str(path)
    return "byte" if info.get("tokenizer") == "byte" else None


async def _read_stream(resp: aiohttp.ClientResponse, t0: float, tokens: TokenMap) -> Generation:
    """Accumulate OpenAI stream chunks (deltas) into one answer; TTFT at the first chunk carrying tokens."""
    answer, done = Answer(), False
    t_first = t_last = t_second = None
    async for now, body in sse_data(resp):
        if body == DONE:
            done = True
            continue
        obj = json.loads(body)
        if isinstance(obj.get("error"), (str, dict)):
            raise RequestError(f"server error: {obj['error']}")
        if answer.absorb(obj):
            t_first = t_first if t_first is not None else now
            t_last = now
            if t_second is None and max(len(answer.token_ids or ()), len(answer.tokens)) > 1:
                t_second = now  # one chunk may carry several tokens: the second can come with the first
    if not done and answer.finish_reason is None:
        raise ReplicaFailure("stream ended before the request finished")
    gen = answer.generation(tokens, None, None, time.perf_counter() - t0)
    ttft, itl = stream_timing(t0, t_first, t_last, len(gen.output_ids))
    return replace(gen, ttft=ttft, itl=itl, ttst=t_second - t0 if t_second is not None else None)
