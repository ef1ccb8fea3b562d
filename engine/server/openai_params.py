"""The OpenAI dialects' request fields: which are honoured, which are accepted at a no-op value, which ignored.

/v1/completions and /v1/chat/completions share these tables, so that what
GuideLLM, `vllm bench serve`, AIPerf and `sglang.bench_serving` send (their
bodies are replayed by tests/engine/server/test_peer_bodies.py) is either
honoured or accepted, and a client asking for something this engine cannot do
gets a 400 naming the field. docs/server.md lists the same tables.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from engine.io_struct import GenerateRequest
from engine.server.validate import (
    MAX_RID_CHARS,
    GenerateCall,
    Limits,
    bad,
    check_default,
    check_unicode,
    get_bool,
    get_int,
    parse_sampling,
    reject_unknown,
    show,
)

MAX_LOGPROBS = 20

# Accepted only at their no-op value(s) (a different value is a 400 naming the field):
# OpenAI's and the vendors' (vLLM, SGLang) sampling and output controls this engine does not implement.
NOOPS: dict[str, tuple] = {
    "top_p": (1.0,), "n": (1,), "presence_penalty": (0.0,), "frequency_penalty": (0.0,),
    "repetition_penalty": (1.0,), "top_k": (-1, 0), "min_p": (0.0,), "length_penalty": (1.0,),
    "use_beam_search": (False,), "include_stop_str_in_output": (False,), "echo": (False,),
    "logit_bias": ({},), "prompt_logprobs": (), "truncate_prompt_tokens": (), "allowed_token_ids": (),
    "bad_words": ([],), "logits_processors": (), "structured_outputs": (), "guided_json": (), "guided_regex": (),
    "guided_choice": (), "guided_grammar": (), "guided_decoding_backend": (), "response_format": ({"type": "text"},),
    "regex": (), "json_schema": (), "ebnf": (), "lora_path": (), "return_hidden_states": (False,),
    "cache_salt": (), "kv_transfer_params": (), "vllm_xargs": (), "chat_template": (), "session_params": (),
}
COMPLETION_NOOPS = {"best_of": (1,), "suffix": ()}
CHAT_NOOPS = {"tools": ([],), "tool_choice": ("none",), "functions": (), "function_call": ("none",),
              "audio": (), "prediction": (), "documents": (), "mm_processor_kwargs": ()}
# Accepted with any value and ignored: they change nothing this engine computes.
IGNORED = {
    "user",  # OpenAI: end-user id for abuse monitoring
    "metadata", "store", "service_tier",  # OpenAI: storage and billing
    "priority",  # vLLM: scheduling priority (one FIFO queue here)
    "add_special_tokens",  # vLLM: the byte tokenizer adds no special tokens either way
    "spaces_between_special_tokens",  # vLLM/SGLang: byte tokens have no spaces to add
    "chat_template_kwargs",  # vLLM/SGLang: the byte chat template takes no options (enable_thinking...)
    "reasoning_effort", "separate_reasoning", "stream_reasoning",  # no reasoning parser
    "parallel_tool_calls",  # meaningful only with tools, which must be empty
}
# Honoured; sampling fields go through validate.parse_sampling
HONOURED = {"model", "temperature", "max_tokens", "stream", "stream_options", "stop", "seed", "ignore_eos",
            "stop_token_ids", "skip_special_tokens", "min_tokens", "return_token_ids", "return_tokens_as_token_ids",
            "request_id", "rid", "nvext", "no_stop_trim"}
COMPLETION_FIELDS = HONOURED | IGNORED | set(NOOPS) | set(COMPLETION_NOOPS) | {"prompt", "logprobs"}
CHAT_FIELDS = HONOURED | IGNORED | set(NOOPS) | set(CHAT_NOOPS) | {
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


def check_common(body: dict, fields: set, noops: dict) -> None:
    """Unknown fields and unsupported values of known ones are a 400 naming the field."""
    reject_unknown(body, fields, "")
    for key, allowed in {**NOOPS, **noops}.items():
        check_default(body, key, key, allowed)
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
