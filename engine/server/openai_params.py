"""The OpenAI dialects' request fields: which are honoured, which are ignored, which are refused and why.

/v1/completions and /v1/chat/completions share these tables (and the sampling
fields of sampling_fields.py), so that what vLLM and SGLang accept, and what
GuideLLM, `vllm bench serve`, AIPerf and `sglang.bench_serving` send (their
bodies are replayed by tests/engine/server/test_peers.py), is honoured, or
accepted where it changes nothing here, or refused with a 400 that names the
field and says why this engine cannot honour it. docs/server.md lists the same
tables.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from engine.io_struct import GenerateRequest
from engine.server import sampling_fields
from engine.server.sampling_fields import CUSTOM, GRAMMAR, ONE_CHOICE, parse_sampling
from engine.server.validate import (
    MAX_RID_CHARS,
    GenerateCall,
    Limits,
    bad,
    check_refused,
    check_unicode,
    get_bool,
    get_int,
    reject_unknown,
    show,
)

MAX_LOGPROBS = 20
TEXT_ONLY = "this engine serves a text-only model"
NO_TOOLS = "tool calling is not supported by this engine"

# field -> (the values that ask for nothing, accepted; why any other value cannot be honoured here)
REFUSED: dict[str, tuple[tuple, str]] = {
    **sampling_fields.REFUSED,
    "use_beam_search": ((False,), "beam search is not implemented by this engine"),
    "echo": ((False,), "echoing the prompt is not implemented: the answer holds the completion only"),
    "response_format": (({"type": "text"},), GRAMMAR), "structured_outputs": ((), GRAMMAR),
    "guided_json": ((), GRAMMAR), "guided_regex": ((), GRAMMAR), "guided_choice": ((), GRAMMAR),
    "guided_grammar": ((), GRAMMAR),
    "prompt_logprobs": ((), "prompt log-probs are not returned here; /generate gives them (return_logprob "
                            "with logprob_start_len)"),
    "logprob_token_ids": ((), "log-probs of chosen token ids are not implemented: use logprobs"),
    "truncate_prompt_tokens": ((), "prompt truncation is not implemented: send the prompt to be served"),
    "logits_processors": ((), CUSTOM), "custom_logit_processor": ((), CUSTOM),
    "vllm_xargs": ((), "vLLM's extra arguments feed custom logits processors, which are not supported"),
    "watermarking": ((False,), "watermarking is not implemented by this engine"),
    "watermark": ((), "watermarking is not implemented by this engine"),
    "repetition_detection": ((), "repetition detection is not implemented by this engine"),
    "lora_path": ((), "LoRA adapters are not supported by this engine"),
    "return_hidden_states": ((False,), "hidden states are not returned by this engine"),
    "cache_salt": ((), "the prefix cache is shared by every request here: it has no salts"),
    "kv_transfer_params": ((), "disaggregated prefill (KV transfer) is not supported by this engine"),
    "chat_template": ((), "the chat template is fixed: the byte tokenizer's"),
    "session_params": ((), "SGLang sessions are not supported: send the whole prompt (the radix cache reuses it)"),
}
COMPLETION_REFUSED = {"best_of": ((1,), ONE_CHOICE), "suffix": (("",), "insertion (suffix) is not supported")}
CHAT_REFUSED = {"tools": (([],), NO_TOOLS), "tool_choice": (("none",), NO_TOOLS), "functions": ((), NO_TOOLS),
                "function_call": (("none",), NO_TOOLS), "audio": ((), TEXT_ONLY),
                "mm_processor_kwargs": ((), TEXT_ONLY),
                "prediction": ((), "predicted outputs are not supported by this engine"),
                "documents": ((), "the chat template takes no documents")}
# Accepted with any value and ignored: they change nothing this engine computes (field -> why)
IGNORED = {
    "user": "OpenAI: an end-user id for abuse monitoring",
    "metadata": "OpenAI: stored-completion tags", "store": "OpenAI: nothing is stored",
    "service_tier": "OpenAI: billing",
    "priority": "vLLM/SGLang: scheduling priority; one FIFO queue here",
    "add_special_tokens": "vLLM: the byte tokenizer adds no special tokens either way",
    "spaces_between_special_tokens": "byte tokens are decoded without spaces either way",
    "stream_interval": "tokens per streamed chunk: one chunk per engine step here, the same text in the end",
    "length_penalty": "only beam search uses it, and beam search is refused",
    "truncation_side": "only prompt truncation uses it, and truncation is refused",
    "guided_decoding_backend": "names a grammar backend; grammars are refused",
    "chat_template_kwargs": "the byte chat template takes no options (enable_thinking...)",
    "reasoning_effort": "no reasoning parser", "separate_reasoning": "no reasoning parser",
    "stream_reasoning": "no reasoning parser", "include_reasoning": "no reasoning parser",
    "thinking_token_budget": "no reasoning parser: the output has no thinking section",
    "parallel_tool_calls": "meaningful only with tools, which are refused",
}
# Honoured; the sampling fields go through sampling_fields.parse_sampling
HONOURED = {*sampling_fields.HONOURED, "model", "max_tokens", "stream", "stream_options", "min_tokens",
            "allowed_token_ids", "bad_words", "include_stop_str_in_output", "return_token_ids",
            "return_tokens_as_token_ids", "request_id", "rid", "nvext"}
COMPLETION_FIELDS = HONOURED | set(IGNORED) | set(REFUSED) | set(COMPLETION_REFUSED) | {"prompt", "logprobs"}
CHAT_FIELDS = HONOURED | set(IGNORED) | set(REFUSED) | set(CHAT_REFUSED) | {
    "messages", "max_completion_tokens", "logprobs", "top_logprobs", "add_generation_prompt",
    "continue_final_message"}


@dataclass(frozen=True)
class AnswerOptions:
    """How an OpenAI answer is shaped, beyond the engine request."""

    logprobs: int | None = None  # top-k per token, or None for no logprobs
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage
    continuous_usage: bool = False  # stream_options.continuous_usage_stats: usage on every chunk (vLLM)
    return_token_ids: bool = False  # vLLM: prompt_token_ids and token_ids in the answer
    tokens_as_ids: bool = False  # vLLM return_tokens_as_token_ids: logprob tokens as "token_id:N"


def check_common(body: dict, fields: set, refused: dict) -> None:
    """Unknown fields, and values this engine cannot honour, are a 400 naming the field (and saying why)."""
    reject_unknown(body, fields, "")
    check_refused(body, {**REFUSED, **refused})
    if body.get("model") is not None and not isinstance(body["model"], str):
        raise bad("model", f"must be a string, got {show(body['model'])}")
    nvext = body.get("nvext")
    if nvext is not None and not isinstance(nvext, dict):
        raise bad("nvext", f"must be a JSON object, got {show(nvext)}")


def stream_flags(body: dict, stream: bool) -> tuple[bool, bool]:
    """(include_usage, continuous_usage) from stream_options; continuous only with include_usage, as in vLLM."""
    opts = body.get("stream_options")
    if opts is None:
        return False, False
    if not stream:
        raise bad("stream_options", "only allowed when stream is true")
    if not isinstance(opts, dict):
        raise bad("stream_options", f"must be a JSON object, got {show(opts)}")
    reject_unknown(opts, {"include_usage", "continuous_usage_stats"}, "stream_options")
    include = get_bool(opts, "include_usage", "stream_options.include_usage", False)
    continuous = get_bool(opts, "continuous_usage_stats", "stream_options.continuous_usage_stats", False)
    return include, include and continuous


def build_call(body: dict, ids: tuple[int, ...], limits: Limits, default_max_new: int, max_new_key: str,
               logprobs: int | None, prefix: str) -> tuple[GenerateCall, AnswerOptions]:
    """The engine request and answer options of a validated OpenAI body whose prompt is `ids`."""
    sampling = dict(body)
    nvext = body.get("nvext") or {}
    if sampling.get("ignore_eos") is None and nvext.get("ignore_eos") is not None:  # Triton/Dynamo's spelling
        sampling["ignore_eos"] = nvext["ignore_eos"]
    params, skip_special, no_stop_trim = parse_sampling(
        sampling, "", limits, default_max_new=default_max_new, max_new_key=max_new_key, default_temperature=1.0,
        min_new_key="min_tokens")
    if len(ids) + params.max_new_tokens > limits.max_context:
        raise bad(max_new_key, f"the prompt has {len(ids)} tokens and {max_new_key} is {params.max_new_tokens}: "
                               f"together more than the context length {limits.max_context}")
    stream = get_bool(body, "stream", "stream", False)
    include_usage, continuous = stream_flags(body, stream)
    req = GenerateRequest(rid=request_id(body, prefix), input_ids=ids, sampling=params,
                          return_logprob=logprobs is not None, top_logprobs_num=logprobs or 0)
    call = GenerateCall(req=req, stream=stream, return_logprob=logprobs is not None, top_logprobs_num=logprobs or 0,
                        skip_special_tokens=skip_special, no_stop_trim=no_stop_trim)
    options = AnswerOptions(
        logprobs=logprobs, include_usage=include_usage, continuous_usage=continuous,
        return_token_ids=get_bool(body, "return_token_ids", "return_token_ids", False),
        tokens_as_ids=get_bool(body, "return_tokens_as_token_ids", "return_tokens_as_token_ids", False))
    return call, options


def request_id(body: dict, prefix: str) -> str:
    """`<prefix>-<id>`: vLLM's request_id (or SGLang's rid) when given, else a fresh uuid (as vLLM names answers)."""
    for key in ("request_id", "rid"):
        if body.get(key) is not None:
            value = body[key]
            if not isinstance(value, str) or not 1 <= len(value) <= MAX_RID_CHARS:
                raise bad(key, f"must be a string of 1..{MAX_RID_CHARS} characters, got {show(value)}")
            return f"{prefix}-{check_unicode(value, key)}"
    return f"{prefix}-{uuid.uuid4().hex}"


def top_logprobs_arg(body: dict, key: str) -> int | None:
    """An integer logprobs count 0..MAX_LOGPROBS, or None."""
    return get_int(body, key, key, None, lo=0, hi=MAX_LOGPROBS)
