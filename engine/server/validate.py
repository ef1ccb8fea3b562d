"""Request validation for the server: JSON bodies in, GenerateRequests out, or an ApiError naming the field.

Everything a client sends passes through here before the engine sees it, so
that a bad body is a 4xx that says what is wrong and never reaches the engine
loop (where an unchecked value could kill it for every client).
"""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import dataclass

from engine.io_struct import GenerateRequest
from protocol.tokenizer import BYTE_TOKENIZER

MAX_SEED = 2**63 - 1
MAX_STOP_STRINGS = 16
MAX_STOP_BYTES = 64  # the engine matches stop strings on the last 64 decoded tokens
MAX_RID_CHARS = 512


class ApiError(Exception):
    """A request the server refuses: HTTP status and a message that names the offending field."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.status}}


def bad(field: str, problem: str) -> ApiError:
    return ApiError(400, f"{field}: {problem}", field)


def show(value, limit: int = 60) -> str:
    """A short repr of a client value for error messages."""
    text = json.dumps(value, default=repr) if not isinstance(value, float) else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


@dataclass(frozen=True)
class Limits:
    """What the served model accepts."""

    vocab_size: int
    max_context: int


# --- typed field readers (JSON null means "use the default") ---------------------------------------
def parse_body(raw: bytes) -> dict:
    """The request body as a JSON object, or a 400 that says why not."""
    try:
        body = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise bad("body", f"not valid UTF-8 ({e.reason} at byte {e.start})") from None
    except RecursionError:
        raise bad("body", "JSON nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, or an integer literal too long to convert
        raise bad("body", f"invalid JSON ({e})") from None
    if not isinstance(body, dict):
        raise bad("body", f"must be a JSON object, got {type(body).__name__}")
    return body


def get_bool(d: dict, key: str, path: str, default: bool) -> bool:
    v = d.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(path, f"must be a boolean, got {show(v)}")
    return v


def get_int(d: dict, key: str, path: str, default: int | None, lo: int | None = None,
            hi: int | None = None) -> int | None:
    v = d.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad(path, f"must be an integer, got {show(v)}")
    if lo is not None and v < lo:
        raise bad(path, f"must be >= {lo}, got {v}")
    if hi is not None and v > hi:
        raise bad(path, f"must be <= {hi}, got {show(v)}")
    return v


def get_float(d: dict, key: str, path: str, default: float, lo: float | None = None,
              hi: float | None = None) -> float:
    v = d.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise bad(path, f"must be a number, got {show(v)}")
    try:
        v = float(v)
    except OverflowError:
        raise bad(path, f"number too large: {show(v)}") from None
    if not math.isfinite(v):
        raise bad(path, f"must be a finite number, got {v}")
    if lo is not None and v < lo:
        raise bad(path, f"must be >= {lo}, got {v}")
    if hi is not None and v > hi:
        raise bad(path, f"must be <= {hi}, got {v}")
    return v


def check_unicode(s: str, path: str) -> str:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise bad(path, "not valid Unicode (contains a lone surrogate)") from None
    return s


def get_stop(d: dict, key: str, path: str) -> tuple[str, ...]:
    """`stop`: a string or a list of strings (SGLang and OpenAI accept both)."""
    v = d.get(key)
    if v is None:
        return ()
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list):
        raise bad(path, f"must be a string or a list of strings, got {show(v)}")
    if len(items) > MAX_STOP_STRINGS:
        raise bad(path, f"at most {MAX_STOP_STRINGS} stop strings, got {len(items)}")
    for s in items:
        if not isinstance(s, str):
            raise bad(path, f"must be a string or a list of strings, got an element {show(s)}")
        if not s:
            raise bad(path, "stop strings must not be empty")
        if len(check_unicode(s, path).encode("utf-8")) > MAX_STOP_BYTES:
            raise bad(path, f"stop strings may be at most {MAX_STOP_BYTES} bytes long, got {show(s)}")
    return tuple(items)


def get_token_ids(v, path: str, limits: Limits, allow_empty: bool = False) -> tuple[int, ...]:
    """A list of token ids, each inside the vocabulary."""
    if not isinstance(v, list):
        raise bad(path, f"must be a list of token ids, got {show(v)}")
    for t in v:
        if isinstance(t, bool) or not isinstance(t, int):
            raise bad(path, f"token ids must be integers, got {show(t)}")
        if not 0 <= t < limits.vocab_size:
            raise bad(path, f"token id {show(t)} is outside the vocabulary (0..{limits.vocab_size - 1})")
    if not v and not allow_empty:
        raise bad(path, "must not be empty")
    return tuple(v)


def check_default(d: dict, key: str, path: str, allowed, reason: str) -> None:
    """A field this engine cannot honour, accepted only at the value(s) that ask for nothing; `reason` says why."""
    v = d.get(key)
    if v is None:
        return
    ok = any(type(v) is type(a) and v == a or (isinstance(a, float) and type(v) is int and v == a) for a in allowed)
    if not ok:
        want = " or ".join(show(a) for a in allowed) if allowed else "null"
        raise bad(path, f"{reason} (only {want} is accepted), got {show(v)}")


def check_refused(d: dict, table: dict[str, tuple[tuple, str]], prefix: str = "") -> None:
    """Each field of `table` (field -> (no-op values, reason)) that `d` holds at another value is a 400 saying why."""
    for key, (allowed, reason) in table.items():
        check_default(d, key, f"{prefix}{key}", allowed, reason)


def reject_unknown(d: dict, known, path: str) -> None:
    unknown = sorted(str(k) for k in d if k not in known)
    if unknown:
        prefix = f"{path}." if path else ""
        raise bad(f"{prefix}{unknown[0]}", f"unknown field (accepted: {', '.join(sorted(known))})")


def prompt_ids(text, input_ids, limits: Limits, text_field: str = "text", ids_field: str = "input_ids"):
    """(field, token ids) of a prompt given as exactly one of text / token ids; checks the context length."""
    if (text is None) == (input_ids is None):
        which = "both were given" if text is not None else "neither was given"
        raise bad(f"{text_field}/{ids_field}", f"exactly one of {text_field} or {ids_field} is required ({which})")
    if text is not None:
        field = text_field
        if not isinstance(text, str):
            raise bad(field, f"must be a string, got {show(text)}")
        if not text:
            raise bad(field, "must not be empty")
        ids = tuple(BYTE_TOKENIZER.encode(check_unicode(text, field)))
    else:
        field = ids_field
        ids = get_token_ids(input_ids, field, limits)
    if len(ids) >= limits.max_context:
        raise bad(field, f"the prompt has {len(ids)} tokens; the context length is {limits.max_context} "
                         "(prompt plus max_new_tokens must fit in it)")
    return field, ids


def check_rid(v) -> str:
    if v is None:
        return uuid.uuid4().hex
    if not isinstance(v, str):
        raise bad("rid", f"must be a string, got {show(v)} (batched requests are not supported)")
    if not v or len(v) > MAX_RID_CHARS:
        raise bad("rid", f"must be 1..{MAX_RID_CHARS} characters long")
    return check_unicode(v, "rid")


@dataclass(frozen=True)
class GenerateCall:
    """A validated /generate (or /v1/completions) request: the engine request plus how to answer it."""

    req: GenerateRequest
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
