"""When a request is done: SGLang's finish reasons as a pure function of the tokens generated so far."""

from __future__ import annotations

from engine.io_struct import SamplingParams
from protocol.tokenizer import BYTE_TOKENIZER, EOS_ID

STOP_WINDOW = 64  # stop strings are matched on the decoded tail of this many tokens


def finish_reason(output_ids: list[int], sp: SamplingParams) -> dict | None:
    """The finish reason once `output_ids` (all generated tokens, the newest last) end the request, else None."""
    if not output_ids:
        return {"type": "length", "length": 0} if sp.max_new_tokens == 0 else None
    token = output_ids[-1]
    if len(output_ids) < sp.min_new_tokens:  # vLLM's stop checker: no stop condition before min_tokens
        return {"type": "length", "length": len(output_ids)} if len(output_ids) >= sp.max_new_tokens else None
    if token == EOS_ID and not sp.ignore_eos:
        return {"type": "stop", "matched": token}
    if token in sp.stop_token_ids:
        return {"type": "stop", "matched": token}
    if sp.stop:
        tail = BYTE_TOKENIZER.decode(output_ids[-STOP_WINDOW:])
        matched = next((s for s in sp.stop if s in tail), None)
        if matched is not None:
            return {"type": "stop", "matched": matched}
    if len(output_ids) >= sp.max_new_tokens:
        return {"type": "length", "length": len(output_ids)}
    return None


def take_until_finished(generated: list[int], new_tokens: list[int], sp: SamplingParams) -> tuple[int, dict | None]:
    """How many of `new_tokens` a request keeps after `generated`, and the finish reason they reach (or None)."""
    ids = list(generated)
    for i, tok in enumerate(new_tokens):
        ids.append(tok)
        reason = finish_reason(ids, sp)
        if reason is not None:
            return i + 1, reason
    return len(new_tokens), None
