"""SGLang's /generate wire format: the request body, the answer as a Generation, and HTTP status handling.

Below both harness/backends/sglang.py (requests) and sglang_probe.py (the probe), which import it.
"""

from __future__ import annotations

import aiohttp

from harness.backends.base import ReplicaFailure, RequestError
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


def window_payload(input_ids: list[int], start: int) -> dict:
    """The /generate body of a restore-window probe (harness/window.py): the prompt again, one greedy token, and
    the log-probs of the prompt tokens from `start` on, which SGLang computes by matching no deeper than `start`
    (and the built-in engine as it does)."""
    return {
        "input_ids": input_ids,
        "sampling_params": {"temperature": 0, "max_new_tokens": 1, "ignore_eos": True},
        "return_logprob": True,
        "logprob_start_len": start,
        "stream": False,
    }


def _input_logprobs(meta: dict) -> list[float | None] | None:
    entries = meta.get("input_token_logprobs")
    if not isinstance(entries, list):
        return None
    return [None if not isinstance(e, list) or not e or e[0] is None else float(e[0]) for e in entries]


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
        input_logprobs=_input_logprobs(meta),
        injected_fault_hit=meta.get("injected_fault_hit") if isinstance(meta.get("injected_fault_hit"), bool)
        else None,
    )


def headers(api_key: str | None) -> dict:
    """The Authorization header for `api_key` (none without one)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def check_status(resp: aiohttp.ClientResponse) -> None:
    """ReplicaFailure on a 5xx answer, RequestError on a 4xx one (with the head of its body)."""
    if resp.status < 400:
        return
    body = (await resp.text())[:300]
    if resp.status >= 500:
        raise ReplicaFailure(f"HTTP {resp.status}: {body}")
    raise RequestError(f"HTTP {resp.status}: {body}")
