"""Response shaping: engine GenerateOutputs as SGLang /generate answers (DESIGN.md 3.1), and token text helpers."""

from __future__ import annotations

import codecs
import json
import math

from engine.io_struct import GenerateOutput
from engine.server.validate import GenerateCall
from protocol.tokenizer import BYTE_TOKENIZER, NUM_BYTES, SPECIAL_NAMES


def finite(x: float) -> float | None:
    """A JSON-safe number: -inf logprobs become a large negative float, NaN becomes null."""
    if math.isnan(x):
        return None
    return x if math.isfinite(x) else math.copysign(1e30, x)


def token_str(token_id: int) -> str:
    """One token as text: ASCII bytes as themselves, other bytes as OpenAI's `bytes:\\xNN`, specials by name."""
    if token_id < 128:
        return chr(token_id)
    if token_id < NUM_BYTES:
        return f"bytes:\\x{token_id:02x}"
    return SPECIAL_NAMES.get(token_id, f"<{token_id}>")


def output_text(out: GenerateOutput, skip_special_tokens: bool = True, no_stop_trim: bool = False) -> str:
    """Decoded output; like SGLang, a matched stop string (and what follows) or stop token is trimmed."""
    ids = out.output_ids
    reason = out.finish_reason or {}
    matched = reason.get("matched") if reason.get("type") == "stop" else None
    if not no_stop_trim and isinstance(matched, int) and ids and ids[-1] == matched:
        ids = ids[:-1]
    text = BYTE_TOKENIZER.decode(ids, keep_special=not skip_special_tokens)
    if not no_stop_trim and isinstance(matched, str):
        pos = text.find(matched)
        if pos >= 0:
            text = text[:pos]
    return text


def text_offsets(ids: list[int], skip_special_tokens: bool = True) -> list[int]:
    """Character offset in the decoded text where each token's text starts (OpenAI `text_offset`)."""
    dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
    offsets, n = [], 0
    for t in ids:
        offsets.append(n)
        if t < NUM_BYTES:
            n += len(dec.decode(bytes([t])))
        elif not skip_special_tokens:
            n += len(dec.decode(b"", final=True)) + len(SPECIAL_NAMES.get(t, ""))
    return offsets


def logprob_entry(lp: float, token_id: int, with_text: bool) -> list:
    """SGLang's `[logprob, token_id, text-or-null]`."""
    return [finite(lp), token_id, token_str(token_id) if with_text else None]


def input_logprob_entries(out: GenerateOutput, req, with_text: bool) -> dict:
    """SGLang's `input_token_logprobs` (`[logprob or null, token_id, text-or-null]` per prompt token from
    logprob_start_len on; null for the first, as SGLang) and `input_top_logprobs` (null there)."""
    ids = req.input_ids[req.logprob_start_len:]
    tokens = [[None if lp is None else finite(lp), t, token_str(t) if with_text else None]
              for lp, t in zip(out.input_logprobs, ids, strict=True)]
    tops = [None if lp is None else [logprob_entry(v, t, with_text) for v, t in top]
            for lp, top in zip(out.input_logprobs, out.input_top_logprobs or [[]] * len(ids), strict=True)]
    return {"input_token_logprobs": tokens, "input_top_logprobs": tops}


def meta_info(out: GenerateOutput, call: GenerateCall, e2e_latency: float, speculative: bool, start: int = 0,
              trace_start: int = 0) -> dict:
    """SGLang's `meta_info` for `out`; per-token lists (logprobs, spec_trace) from `start` / `trace_start` on."""
    meta = {
        "id": out.rid,
        "finish_reason": out.finish_reason if out.finished else None,
        "prompt_tokens": out.prompt_tokens,
        "completion_tokens": out.completion_tokens,
        "cached_tokens": out.cached_tokens,
        "e2e_latency": e2e_latency,
    }
    if call.return_logprob:
        with_text = call.return_text_in_logprobs
        ids = out.output_ids
        meta["output_token_logprobs"] = [
            logprob_entry(out.output_logprobs[i], ids[i], with_text) for i in range(start, len(out.output_logprobs))]
        meta["output_top_logprobs"] = [
            [logprob_entry(lp, t, with_text) for lp, t in out.output_top_logprobs[i]]
            for i in range(start, len(out.output_top_logprobs))]
        if call.req.scores_prompt and start == 0 and (out.output_ids or out.finished):
            meta.update(input_logprob_entries(out, call.req, with_text))  # once: with the first output token
    if out.injected_fault_hit is not None:  # a fault is injected: whether it reached this request (docs/engine.md)
        meta["injected_fault_hit"] = out.injected_fault_hit
    if speculative:
        meta["spec_verify_ct"] = out.spec_verify_ct
        meta["spec_accept_length"] = out.spec_accept_length
        meta["spec_trace"] = [list(step) for step in out.spec_trace[trace_start:]]
    return meta


def generate_answer(out: GenerateOutput, call: GenerateCall, e2e_latency: float, speculative: bool) -> dict:
    """The (unstreamed) /generate answer for the finished output `out`."""
    text = output_text(out, call.skip_special_tokens, call.no_stop_trim)
    return {"text": text, "output_ids": list(out.output_ids),
            "meta_info": meta_info(out, call, e2e_latency, speculative)}


class GenerateStream:
    """Streamed /generate chunks as SGLang sends them with `--incremental-streaming-output`: each chunk carries
    only the new `output_ids`, the new log-prob entries, the new `spec_trace` steps and the new text;
    `meta_info` counters (`completion_tokens`, `cached_tokens`, `spec_verify_ct`...) are cumulative. The chunks'
    texts concatenate to the unstreamed answer's text, so a few characters are held back while they could still
    start a stop string that would be trimmed. A chunk costs O(new tokens), never O(output so far).
    """

    def __init__(self, call: GenerateCall, speculative: bool) -> None:
        self.call, self.speculative = call, speculative
        self.sent_tokens = 0
        self.sent_trace = 0
        self.sent_chars = 0
        self.pending = ""  # decoded text not yet sent
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.hold = 0 if call.no_stop_trim else max((len(s) for s in call.req.sampling.stop), default=1) - 1

    def _decode_new(self, ids: list[int]) -> None:
        run = bytearray()
        for t in ids:
            if t < NUM_BYTES:
                run.append(t)
            elif not self.call.skip_special_tokens:  # as ByteTokenizer.decode: a special ends a byte run
                self.pending += self.decoder.decode(bytes(run), final=True) + SPECIAL_NAMES.get(t, "")
                run.clear()
        self.pending += self.decoder.decode(bytes(run))

    def _text(self, out: GenerateOutput, new_ids: list[int]) -> str:
        if out.finished:  # trimming needs the whole text, once
            text = output_text(out, self.call.skip_special_tokens, self.call.no_stop_trim)[self.sent_chars:]
        else:
            self._decode_new(new_ids)
            cut = max(len(self.pending) - self.hold, 0)
            text, self.pending = self.pending[:cut], self.pending[cut:]
        self.sent_chars += len(text)
        return text

    def chunk(self, out: GenerateOutput, e2e_latency: float) -> dict:
        """The next chunk: what `out` holds beyond what earlier chunks sent."""
        new_ids = out.output_ids[self.sent_tokens:]
        meta = meta_info(out, self.call, e2e_latency, self.speculative, self.sent_tokens, self.sent_trace)
        text = self._text(out, new_ids)
        self.sent_tokens += len(new_ids)
        self.sent_trace = len(out.spec_trace)
        return {"text": text, "output_ids": new_ids, "meta_info": meta}


def sse(obj) -> bytes:
    """One server-sent event carrying a JSON object."""
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
