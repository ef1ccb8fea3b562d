"""OpenAI-compatible endpoints: POST /v1/completions, POST /v1/chat/completions (chat.py), GET /v1/models.

What the two answers share (finish reason, usage, token names, the incremental stream) is openai_answer.py's.

One prompt and one choice per request. `model` must be the served model id or
one of its aliases (served_model.py): another name is a 404 naming the served
one. Which fields are honoured, accepted at a no-op value or ignored is in
openai_params.py (and docs/server.md); anything else is a 400 naming the field.
vLLM's answer extensions are supported: `return_token_ids` (prompt_token_ids
and token_ids in the choice), `return_tokens_as_token_ids` (logprob tokens as
"token_id:N") and `stream_options.continuous_usage_stats` (usage on every chunk).
"""

from __future__ import annotations

import time

from aiohttp import web

from engine.io_struct import GenerateOutput
from engine.server.chat import handle_chat
from engine.server.format import finite, output_text, text_offsets
from engine.server.openai_answer import DeltaStream, finish_reason, token_name, usage
from engine.server.openai_params import (
    COMPLETION_FIELDS,
    COMPLETION_REFUSED,
    AnswerOptions,
    build_call,
    check_common,
    top_logprobs_arg,
)
from engine.server.state import final_output, generation, read_json, state_of, stream_events
from engine.server.validate import GenerateCall, Limits, bad, prompt_ids, show

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's, vLLM's and SGLang's


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


def parse_completion(body: dict, limits: Limits) -> tuple[GenerateCall, AnswerOptions]:
    """The engine call and answer options of a /v1/completions body."""
    check_common(body, COMPLETION_FIELDS, COMPLETION_REFUSED)
    if "prompt" not in body or body["prompt"] is None:
        raise bad("prompt", "is required")
    text, ids = one_prompt(body["prompt"])
    _, ids = prompt_ids(text, ids, limits, text_field="prompt", ids_field="prompt")
    return build_call(body, ids, limits, default_max_new=COMPLETION_DEFAULT_MAX_TOKENS, max_new_key="max_tokens",
                      logprobs=top_logprobs_arg(body, "logprobs"), prefix="cmpl")


def completion_logprobs(out: GenerateOutput, start: int, call: GenerateCall, opts: AnswerOptions) -> dict:
    """OpenAI's legacy logprobs object for output tokens [start:]; top_logprobs include the chosen token."""
    ids, as_ids = out.output_ids, opts.tokens_as_ids
    offsets = text_offsets(ids, call.skip_special_tokens)
    top = []
    for i in range(start, len(ids)):
        entry = {token_name(t, as_ids): finite(lp) for lp, t in out.output_top_logprobs[i]}
        entry.setdefault(token_name(ids[i], as_ids), finite(out.output_logprobs[i]))
        top.append(entry)
    return {"tokens": [token_name(t, as_ids) for t in ids[start:]],
            "token_logprobs": [finite(lp) for lp in out.output_logprobs[start:]],
            "top_logprobs": top, "text_offset": offsets[start:]}


class CompletionStream(DeltaStream):
    def chunk(self, out: GenerateOutput, delta: str, start: int) -> dict:
        lp = completion_logprobs(out, start, self.call, self.opts) if self.opts.logprobs is not None else None
        choice = {"index": 0, "text": delta, "logprobs": lp, "finish_reason": finish_reason(out)}
        if self.opts.return_token_ids:
            choice["token_ids"] = list(out.output_ids[start:])
            if self.first:
                choice["prompt_token_ids"] = list(self.call.req.input_ids)
        return dict(self.head, choices=[choice])


async def handle_completions(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    body = await read_json(request)
    call, opts = parse_completion(body, state.limits)
    head = {"id": call.req.rid, "object": "text_completion", "created": int(time.time()),
            "model": state.served.answer_name(body.get("model"))}
    async with generation(request, call.req) as (first, agen):
        if call.stream:
            return await stream_events(request, first, agen, CompletionStream(head, call, opts).events)
        out = await final_output(request, first, agen)
    choice = {"index": 0, "text": output_text(out, call.skip_special_tokens, call.no_stop_trim),
              "logprobs": completion_logprobs(out, 0, call, opts) if opts.logprobs is not None else None,
              "finish_reason": finish_reason(out)}
    if opts.return_token_ids:
        choice.update(prompt_token_ids=list(call.req.input_ids), token_ids=list(out.output_ids))
    return web.json_response(dict(head, system_fingerprint=None, choices=[choice], usage=usage(out)))


async def handle_models(request: web.Request) -> web.Response:
    """vLLM's model card: `root` is the directory a tool loads the tokenizer from (served_model.py)."""
    state = state_of(request)
    model = {"id": state.served.name, "object": "model", "created": int(state.started), "owned_by": "specgate",
             "root": state.served.root, "parent": None, "max_model_len": state.limits.max_context}
    return web.json_response({"object": "list", "data": [model]})


def add_openai_routes(app: web.Application) -> None:
    """Serve the OpenAI-compatible endpoints on `app`."""
    app.router.add_post("/v1/completions", handle_completions)
    app.router.add_post("/v1/chat/completions", handle_chat)
    app.router.add_get("/v1/models", handle_models)
