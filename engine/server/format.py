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


def generate_answer(out: GenerateOutput, call: GenerateCall, e2e_latency: float, speculative: bool) -> dict:
    """The /generate answer (or one cumulative stream snapshot) for output `out`."""
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
        meta["output_token_logprobs"] = [
            logprob_entry(lp, t, with_text) for lp, t in zip(out.output_logprobs, out.output_ids, strict=False)]
        meta["output_top_logprobs"] = [
            [logprob_entry(lp, t, with_text) for lp, t in top] for top in out.output_top_logprobs]
    if speculative:
        meta["spec_verify_ct"] = out.spec_verify_ct
        meta["spec_accept_length"] = out.spec_accept_length
        meta["spec_trace"] = [list(step) for step in out.spec_trace]
    text = output_text(out, call.skip_special_tokens, call.no_stop_trim) if out.finished else \
        BYTE_TOKENIZER.decode(out.output_ids, keep_special=not call.skip_special_tokens)
    return {"text": text, "output_ids": list(out.output_ids), "meta_info": meta}


def sse(obj) -> bytes:
    """One server-sent event carrying a JSON object."""
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
