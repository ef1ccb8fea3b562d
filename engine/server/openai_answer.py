"""What the OpenAI-compatible answers share (openai.py's completions, chat.py's chat completions): the finish
reason, the usage object, how a logprobs entry names a token, and the incremental stream that turns the engine's
cumulative snapshots into chunks (each endpoint shapes its own chunk).
"""

from __future__ import annotations

from engine.io_struct import GenerateOutput
from engine.server.format import output_text, sse, token_str
from engine.server.openai_params import AnswerOptions
from engine.server.validate import GenerateCall
from protocol.tokenizer import BYTE_TOKENIZER

FINISH = {"length": "length", "stop": "stop", "abort": "abort"}


def token_name(token_id: int, as_ids: bool) -> str:
    """A token as OpenAI logprobs name it: its text, or vLLM's "token_id:N" with return_tokens_as_token_ids."""
    return f"token_id:{token_id}" if as_ids else token_str(token_id)


def usage(out: GenerateOutput) -> dict:
    """OpenAI usage (so far, for a continuous-usage chunk), with vLLM's cached_tokens detail."""
    return {"prompt_tokens": out.prompt_tokens, "completion_tokens": out.completion_tokens,
            "total_tokens": out.prompt_tokens + out.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": out.cached_tokens}}


def finish_reason(out: GenerateOutput) -> str | None:
    """OpenAI's finish reason of an answer: None until it finished."""
    if not out.finished or not out.finish_reason:
        return None
    return FINISH.get(out.finish_reason.get("type"), "stop")


class DeltaStream:
    """Turns cumulative engine snapshots into OpenAI's incremental stream chunks (`chunk` shapes one)."""

    def __init__(self, head: dict, call: GenerateCall, opts: AnswerOptions):
        self.head, self.call, self.opts = head, call, opts
        self.sent_chars = 0
        self.sent_tokens = 0
        self.first = True  # the first chunk carries the prompt's token ids (vLLM) and the chat role
        self.hold = 0 if call.no_stop_trim else max((len(s) for s in call.req.sampling.stop), default=1) - 1

    def stable_text(self, out: GenerateOutput) -> str:
        """Text that can no longer change: no trailing partial UTF-8, no possible start of a stop string."""
        if out.finished:
            return output_text(out, self.call.skip_special_tokens, self.call.no_stop_trim)
        text = BYTE_TOKENIZER.decode(out.output_ids, keep_special=not self.call.skip_special_tokens).rstrip("\ufffd")
        return text[: len(text) - self.hold] if self.hold else text

    def chunk(self, out: GenerateOutput, delta: str, start: int) -> dict:
        """The endpoint's chunk carrying `delta` (new text) and the output tokens from `start`."""
        raise NotImplementedError

    def events(self, out: GenerateOutput) -> list[bytes]:
        """The SSE events of a new engine snapshot: none while nothing stable changed."""
        text = self.stable_text(out)
        delta = text[self.sent_chars:]
        if not delta and len(out.output_ids) == self.sent_tokens and not out.finished:
            return []
        chunk = self.chunk(out, delta, self.sent_tokens)
        self.first = False
        self.sent_chars = max(self.sent_chars, len(text))
        self.sent_tokens = len(out.output_ids)
        if self.opts.continuous_usage:
            chunk["usage"] = usage(out)
        events = [sse(chunk)]
        if out.finished and self.opts.include_usage:
            events.append(sse(dict(self.head, choices=[], usage=usage(out))))
        return events
