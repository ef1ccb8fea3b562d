"""POST /v1/chat/completions over the byte tokenizer's trivial chat template.

The template (the same text as BYTE_CHAT_TEMPLATE in protocol/byte_export.py,
the Jinja form shipped in the exported tokenizer_config.json): one line
`<role>: <content>` per message, then `assistant: ` when a generation prompt is
asked for (the default). A message's content is a string, null, or a list of
text parts joined with "\\n" (as vLLM joins them); the engine is text-only, so
image, audio and video parts are a 400. With vLLM's `continue_final_message`
the last (assistant) message is left open: no newline, no generation prompt.
"""

from __future__ import annotations

import time

from aiohttp import web

from engine.io_struct import GenerateOutput
from engine.server.format import finite, output_text, token_str
from engine.server.openai_answer import DeltaStream, finish_reason, token_name, usage
from engine.server.openai_params import (
    CHAT_FIELDS,
    CHAT_REFUSED,
    AnswerOptions,
    build_call,
    check_common,
    top_logprobs_arg,
)
from engine.server.state import final_output, generation, read_json, state_of, stream_events
from engine.server.validate import GenerateCall, Limits, bad, get_bool, prompt_ids, show
from protocol.tokenizer import NUM_BYTES

# Without max_tokens (or max_completion_tokens) a chat answer stops here, or where the context ends. OpenAI, vLLM
# and SGLang run on to the end of the context (2,028 tokens after a short prompt on this model); 128 is what
# /generate and SGLang's SamplingParams default to, so a request that leaves it out is bounded the same everywhere.
CHAT_DEFAULT_MAX_TOKENS = 128
ROLES = {"system", "developer", "user", "assistant", "tool", "function"}
MESSAGE_FIELDS = {"role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content", "reasoning",
                  "refusal"}


def message_text(content, path: str) -> str:
    """A message's content as text: a string, null (""), or text parts joined with newlines."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(path, f"must be a string, null or a list of content parts, got {show(content)}")
    texts = []
    for j, part in enumerate(content):
        where = f"{path}[{j}]"
        if not isinstance(part, dict):
            raise bad(where, f"must be a content part object, got {show(part)}")
        if part.get("type") != "text":
            raise bad(f"{where}.type", f"this engine is text-only: only 'text' parts, got {show(part.get('type'))}")
        if not isinstance(part.get("text"), str):
            raise bad(f"{where}.text", f"must be a string, got {show(part.get('text'))}")
        texts.append(part["text"])
    return "\n".join(texts)


def checked_messages(messages) -> list[tuple[str, str]]:
    """(role, content text) of each message, or a 400 naming the bad one."""
    if not isinstance(messages, list) or not messages:
        raise bad("messages", f"must be a non-empty list of messages, got {show(messages)}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}]", f"must be a message object, got {show(m)}")
        unknown = sorted(str(k) for k in m if k not in MESSAGE_FIELDS)
        if unknown:
            raise bad(f"messages[{i}].{unknown[0]}", f"unknown field (accepted: {', '.join(sorted(MESSAGE_FIELDS))})")
        if m.get("role") not in ROLES:
            raise bad(f"messages[{i}].role", f"must be one of {', '.join(sorted(ROLES))}, got {show(m.get('role'))}")
        if m.get("tool_calls"):
            raise bad(f"messages[{i}].tool_calls", "tool calls are not supported by this engine (only null or [])")
        out.append((m["role"], message_text(m.get("content"), f"messages[{i}].content")))
    return out


def render_chat(messages: list[tuple[str, str]], add_generation_prompt: bool = True,
                continue_final_message: bool = False) -> str:
    """The prompt text of `messages` under the byte tokenizer's template (see the module doc)."""
    lines = [f"{role}: {content}\n" for role, content in messages]
    if continue_final_message:
        lines[-1] = lines[-1][:-1]
    return "".join(lines) + ("assistant: " if add_generation_prompt else "")


def parse_chat(body: dict, limits: Limits) -> tuple[GenerateCall, AnswerOptions]:
    """The engine call and answer options of a /v1/chat/completions body."""
    check_common(body, CHAT_FIELDS, CHAT_REFUSED)
    add_prompt = get_bool(body, "add_generation_prompt", "add_generation_prompt", True)
    cont = get_bool(body, "continue_final_message", "continue_final_message", False)
    messages = checked_messages(body.get("messages"))
    if cont and add_prompt:
        raise bad("continue_final_message", "cannot be true while add_generation_prompt is true (set it to false)")
    if cont and messages[-1][0] != "assistant":
        raise bad("continue_final_message", f"the last message must be the assistant's, got {messages[-1][0]!r}")
    _, ids = prompt_ids(render_chat(messages, add_prompt, cont), None, limits, text_field="messages")
    logprobs = get_bool(body, "logprobs", "logprobs", False)
    top = top_logprobs_arg(body, "top_logprobs")
    if top and not logprobs:
        raise bad("top_logprobs", "requires logprobs: true")
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    default = min(CHAT_DEFAULT_MAX_TOKENS, limits.max_context - len(ids))  # the prompt leaves at least 1
    return build_call(body, ids, limits, default_max_new=default, max_new_key=key,
                      logprobs=(top or 0) if logprobs else None, prefix="chatcmpl")


def token_bytes(token_id: int) -> list[int]:
    return [token_id] if token_id < NUM_BYTES else list(token_str(token_id).encode())


def chat_logprobs(out: GenerateOutput, start: int, opts: AnswerOptions) -> dict:
    """The chat logprobs object ({"content": [...]}) for output tokens [start:]."""
    def entry(lp: float, t: int) -> dict:
        return {"token": token_name(t, opts.tokens_as_ids), "logprob": finite(lp), "bytes": token_bytes(t)}

    content = []
    for i in range(start, len(out.output_ids)):
        e = entry(out.output_logprobs[i], out.output_ids[i])
        e["top_logprobs"] = [entry(lp, t) for lp, t in out.output_top_logprobs[i]]
        content.append(e)
    return {"content": content}


class ChatStream(DeltaStream):
    def chunk(self, out: GenerateOutput, delta: str, start: int) -> dict:
        lp = chat_logprobs(out, start, self.opts) if self.opts.logprobs is not None else None
        choice = {"index": 0, "delta": {"role": "assistant", "content": delta} if self.first else {"content": delta},
                  "logprobs": lp, "finish_reason": finish_reason(out)}
        chunk = dict(self.head, choices=[choice])
        if self.opts.return_token_ids:
            choice["token_ids"] = list(out.output_ids[start:])
            if self.first:
                chunk["prompt_token_ids"] = list(self.call.req.input_ids)
        return chunk


async def handle_chat(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    body = await read_json(request)
    call, opts = parse_chat(body, state.limits)
    head = {"id": call.req.rid, "object": "chat.completion.chunk", "created": int(time.time()),
            "model": state.served.answer_name(body.get("model"))}
    async with generation(request, call.req) as (first, agen):
        if call.stream:
            return await stream_events(request, first, agen, ChatStream(head, call, opts).events)
        out = await final_output(request, first, agen)
    choice = {"index": 0, "message": {"role": "assistant",
                                           "content": output_text(out, call.skip_special_tokens, call.no_stop_trim)},
              "logprobs": chat_logprobs(out, 0, opts) if opts.logprobs is not None else None,
              "finish_reason": finish_reason(out)}
    answer = dict(head, object="chat.completion", system_fingerprint=None, choices=[choice], usage=usage(out))
    if opts.return_token_ids:
        choice["token_ids"] = list(out.output_ids)
        answer["prompt_token_ids"] = list(call.req.input_ids)
    return web.json_response(answer)
