"""The OpenAI backend's probe request: what an answer carries (ids, log-probs, cached tokens) and how to flush.

One short greedy /v1/completions request per endpoint, before the run writes
anything. A strict OpenAI server that refuses vLLM's fields (`ignore_eos`,
`return_token_ids`) is asked again without them, and the probe says so.
"""

from __future__ import annotations

from harness.backends.base import ReplicaFailure, RequestError
from harness.backends.openai_parse import TOP_K, UNKNOWN_ID, Answer, status_json

PROBE_IDS = [1, 2, 3, 4]
FLUSH_PATHS = ("/flush_cache", "/reset_prefix_cache")  # SGLang and the built-in engine; vLLM (dev mode)


async def _ask(backend, http, url: str, endpoint) -> tuple[int, dict | None, str]:
    body = backend.body(endpoint, {"input_ids": PROBE_IDS, "max_new_tokens": 2, "stream": False})
    try:
        return await status_json(http, "POST", f"{url}/v1/completions", backend.headers(), body, timeout=60)
    except ReplicaFailure as e:
        raise RequestError(f"endpoint {url}: the probe /v1/completions request failed ({e})") from e


async def check_answers(backend, http, url: str, role: str, endpoint) -> tuple[list[str], list[str], dict]:
    """(unknown, notes, found) from one probe request; RequestError where `role` cannot do without."""
    unknown, notes = [], []
    status, obj, head = await _ask(backend, http, url, endpoint)
    if status == 400:
        endpoint.vendor_fields = False
        status, obj, head = await _ask(backend, http, url, endpoint)
        notes.append("the server refuses vLLM's ignore_eos / return_token_ids: outputs may stop early at EOS, "
                     "and ids come from the logprob tokens")
    if status != 200 or not isinstance(obj, dict):
        raise RequestError(f"endpoint {url}: the probe /v1/completions request failed (HTTP {status}: {head})")
    answer = Answer()
    answer.absorb(obj)
    if answer.token_ids is not None:
        source = "token_ids"
    elif answer.tokens and all(t.startswith("token_id:") for t in answer.tokens):
        source = "token_id strings"
    else:
        source = f"logprob token strings mapped with tokenizer {endpoint.tokens.spec}"
    try:
        ids = answer.output_ids(endpoint.tokens)
    except RequestError as e:
        raise RequestError(
            f"endpoint {url}: {e}; start vLLM with --return-tokens-as-token-ids, or pass --tokenizer (the target's "
            "tokenizer.json or model directory) so token strings can be mapped back") from None
    if source.startswith("logprob"):
        notes.append(f"output ids: {source}")
    tops = [answer.top_entries(i, ids, endpoint.tokens) for i in range(len(answer.top_logprobs))]
    width = min(len(t) for t in tops) if tops and len(tops) == len(ids) else 0
    if any(e[1] == UNKNOWN_ID for t in tops for e in t):
        unknown.append("top_logprob_ids")
        notes.append("top log-prob alternatives carry no ids (recorded as -1; vLLM: --return-tokens-as-token-ids, "
                     "or pass --tokenizer): margins hold, a divergent token's rank may not")
    has_logprobs = len(answer.token_logprobs) >= len(ids) and all(x is not None for x in answer.token_logprobs)
    level = f"top-{TOP_K}" if has_logprobs and width >= TOP_K else ("chosen token only" if has_logprobs else "none")
    if role == "reference" and level != f"top-{TOP_K}":
        raise RequestError(f"endpoint {url}: the reference's answer has log-probs {level!r}; specgate needs the top "
                           f"{TOP_K} per token (logprobs: {TOP_K}) for the margin test")
    if role == "candidate" and level != f"top-{TOP_K}":
        unknown.append("candidate_logprobs" if not has_logprobs else "candidate_top_logprobs")
        notes.append(f"candidate log-probs: {level}; the oracle falls back to tokens and the reference's margins")
    if ((obj.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens") is None:
        unknown.append("cached_tokens")
        notes.append("no usage.prompt_tokens_details.cached_tokens (vLLM: --enable-prompt-tokens-details): "
                     "restored prefixes cannot be seen per request")
    return unknown, notes, {"output_ids": source, "logprobs": level}


async def find_flush(backend, http, url: str) -> str | None:
    """The path that empties the server's prefix cache (tried now, before the run), or None."""
    for path in FLUSH_PATHS:
        try:
            status, _, _ = await status_json(http, "POST", f"{url}{path}", backend.headers())
        except ReplicaFailure:
            return None
        if status < 300 or status == 400:  # 400: the built-in engine is busy; the path exists
            return path
    return None
