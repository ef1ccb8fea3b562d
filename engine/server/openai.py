"""OpenAI-compatible endpoints: POST /v1/completions and GET /v1/models, so third-party load tools can drive us.

Only single-prompt, single-choice completions; OpenAI fields this engine does
not implement are accepted at their no-op values and rejected otherwise,
naming the field. vLLM/SGLang extensions `ignore_eos`, `stop_token_ids` and
`top_k` (-1) are accepted, as their benchmark clients send them.
"""

from __future__ import annotations

import time
import uuid

from aiohttp import web

from engine.io_struct import GenerateOutput, GenerateRequest
from engine.server.format import finite, output_text, sse, text_offsets, token_str
from engine.server.state import final_output, generation, read_json, state_of, stream_events
from engine.server.validate import (
    GenerateCall,
    Limits,
    bad,
    check_default,
    get_bool,
    get_int,
    parse_sampling,
    prompt_ids,
    reject_unknown,
    show,
)
from protocol.tokenizer import BYTE_TOKENIZER

MAX_LOGPROBS = 20
COMPLETION_NOOPS: dict[str, tuple] = {
    "top_p": (1.0,), "n": (1,), "echo": (False,), "presence_penalty": (0.0,), "frequency_penalty": (0.0,),
    "best_of": (1,), "suffix": (), "top_k": (-1,), "min_tokens": (0,), "repetition_penalty": (1.0,),
}
COMPLETION_FIELDS = {"model", "prompt", "max_tokens", "temperature", "stream", "stream_options", "logprobs", "stop",
                     "seed", "user", "logit_bias", "ignore_eos", "stop_token_ids", "skip_special_tokens",
                     *COMPLETION_NOOPS}
FINISH = {"length": "length", "stop": "stop", "abort": "abort"}


def one_prompt(prompt):
    """(text, token ids): exactly one is set; a batch of one is unwrapped, larger batches are refused."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise bad("prompt", f"batched prompts are not supported (got {len(prompt)}); send one per request")
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, list):
        return None, prompt
    raise bad("prompt", f"must be a string or a list of token ids, got {show(prompt)}")


def parse_completion(body: dict, limits: Limits) -> tuple[GenerateCall, int | None, bool]:
    """(call, logprobs top-k or None, include_usage) from a /v1/completions body."""
    reject_unknown(body, COMPLETION_FIELDS, "")
    for key, allowed in COMPLETION_NOOPS.items():
        check_default(body, key, key, allowed)
    if body.get("logit_bias") not in (None, {}):
        raise bad("logit_bias", "not supported by this engine (only null or {} is accepted)")
    for key in ("model", "user"):
        if body.get(key) is not None and not isinstance(body[key], str):
            raise bad(key, f"must be a string, got {show(body[key])}")
    if "prompt" not in body or body["prompt"] is None:
        raise bad("prompt", "is required")
    text, ids = one_prompt(body["prompt"])
    _, ids = prompt_ids(text, ids, limits, text_field="prompt", ids_field="prompt")
    params, skip_special, _ = parse_sampling(body, "", limits, default_max_new=16, max_new_key="max_tokens",
                                             default_temperature=1.0)
    logprobs = get_int(body, "logprobs", "logprobs", None, lo=0, hi=MAX_LOGPROBS)
    stream = get_bool(body, "stream", "stream", False)
    include_usage = False
    opts = body.get("stream_options")
    if opts is not None:
        if not stream:
            raise bad("stream_options", "only allowed when stream is true")
        if not isinstance(opts, dict):
            raise bad("stream_options", f"must be a JSON object, got {show(opts)}")
        reject_unknown(opts, {"include_usage"}, "stream_options")
        include_usage = get_bool(opts, "include_usage", "stream_options.include_usage", False)
    req = GenerateRequest(rid=f"cmpl-{uuid.uuid4().hex}", input_ids=ids, sampling=params,
                          return_logprob=logprobs is not None, top_logprobs_num=logprobs or 0)
    call = GenerateCall(req=req, stream=stream, return_logprob=logprobs is not None,
                        top_logprobs_num=logprobs or 0, skip_special_tokens=skip_special)
    return call, logprobs, include_usage


def completion_logprobs(out: GenerateOutput, start: int, skip_special: bool) -> dict:
    """OpenAI's legacy logprobs object for output tokens [start:]; top_logprobs include the chosen token."""
    ids = out.output_ids
    offsets = text_offsets(ids, skip_special)
    top = []
    for i in range(start, len(ids)):
        entry = {token_str(t): finite(lp) for lp, t in out.output_top_logprobs[i]}
        entry.setdefault(token_str(ids[i]), finite(out.output_logprobs[i]))
        top.append(entry)
    return {"tokens": [token_str(t) for t in ids[start:]],
            "token_logprobs": [finite(lp) for lp in out.output_logprobs[start:]],
            "top_logprobs": top, "text_offset": offsets[start:]}


def usage(out: GenerateOutput) -> dict:
    return {"prompt_tokens": out.prompt_tokens, "completion_tokens": out.completion_tokens,
            "total_tokens": out.prompt_tokens + out.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": out.cached_tokens}}


def finish_reason(out: GenerateOutput) -> str | None:
    if not out.finished or not out.finish_reason:
        return None
    return FINISH.get(out.finish_reason.get("type"), "stop")


class CompletionStream:
    """Turns cumulative engine snapshots into OpenAI's incremental stream chunks."""

    def __init__(self, head: dict, call: GenerateCall, logprobs: int | None, include_usage: bool):
        self.head, self.call, self.logprobs, self.include_usage = head, call, logprobs, include_usage
        self.sent_chars = 0
        self.sent_tokens = 0
        self.hold = max((len(s) for s in call.req.sampling.stop), default=1) - 1

    def stable_text(self, out: GenerateOutput) -> str:
        """Text that can no longer change: no trailing partial UTF-8, no possible start of a stop string."""
        if out.finished:
            return output_text(out, self.call.skip_special_tokens)
        text = BYTE_TOKENIZER.decode(out.output_ids, keep_special=not self.call.skip_special_tokens).rstrip("\ufffd")
        return text[: len(text) - self.hold] if self.hold else text

    def events(self, out: GenerateOutput) -> list[bytes]:
        text = self.stable_text(out)
        delta = text[self.sent_chars:]
        new_tokens = len(out.output_ids) > self.sent_tokens
        if not delta and not new_tokens and not out.finished:
            return []
        lp = completion_logprobs(out, self.sent_tokens, self.call.skip_special_tokens) \
            if self.logprobs is not None else None
        self.sent_chars = max(self.sent_chars, len(text))
        self.sent_tokens = len(out.output_ids)
        chunk = dict(self.head, choices=[{"index": 0, "text": delta, "logprobs": lp,
                                          "finish_reason": finish_reason(out)}])
        events = [sse(chunk)]
        if out.finished and self.include_usage:
            events.append(sse(dict(self.head, choices=[], usage=usage(out))))
        return events


async def handle_completions(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    call, logprobs, include_usage = parse_completion(await read_json(request), state.limits)
    head = {"id": call.req.rid, "object": "text_completion", "created": int(time.time()), "model": state.model_name}
    async with generation(request, call.req) as (first, agen):
        if call.stream:
            stream = CompletionStream(head, call, logprobs, include_usage)
            return await stream_events(request, first, agen, stream.events)
        out = await final_output(request, first, agen)
    choice = {"index": 0, "text": output_text(out, call.skip_special_tokens),
              "logprobs": completion_logprobs(out, 0, call.skip_special_tokens) if logprobs is not None else None,
              "finish_reason": finish_reason(out)}
    return web.json_response(dict(head, system_fingerprint=None, choices=[choice], usage=usage(out)))


async def handle_models(request: web.Request) -> web.Response:
    state = state_of(request)
    model = {"id": state.model_name, "object": "model", "created": int(state.started), "owned_by": "specgate",
             "root": state.cfg.model_path, "max_model_len": state.limits.max_context}
    return web.json_response({"object": "list", "data": [model]})


def add_openai_routes(app: web.Application) -> None:
    app.router.add_post("/v1/completions", handle_completions)
    app.router.add_get("/v1/models", handle_models)
