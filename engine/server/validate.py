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

from engine.io_struct import GenerateRequest, SamplingParams
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


def get_float(d: dict, key: str, path: str, default: float, lo: float | None = None) -> float:
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


def check_default(d: dict, key: str, path: str, allowed) -> None:
    """A field this engine does not implement, accepted only at its no-op value(s)."""
    v = d.get(key)
    if v is None:
        return
    ok = any(type(v) is type(a) and v == a or (isinstance(a, float) and type(v) is int and v == a) for a in allowed)
    if not ok:
        want = " or ".join(show(a) for a in allowed) if allowed else "null"
        raise bad(path, f"not supported by this engine (only {want} is accepted), got {show(v)}")


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


# --- /generate ----------------------------------------------------------------------------------
# SGLang sampling fields this engine does not implement, accepted at their no-op values
SAMPLING_NOOPS: dict[str, tuple] = {
    "top_p": (1.0,), "top_k": (-1,), "min_p": (0.0,), "frequency_penalty": (0.0,), "presence_penalty": (0.0,),
    "repetition_penalty": (1.0,), "n": (1,), "json_schema": (), "regex": (),
    "ebnf": (), "structural_tag": (), "logit_bias": (), "custom_params": (),
}
SAMPLING_FIELDS = {"temperature", "max_new_tokens", "min_new_tokens", "ignore_eos", "stop", "stop_token_ids", "seed",
                   "sampling_seed", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim",
                   *SAMPLING_NOOPS}
# top-level SGLang fields accepted at their no-op value
GENERATE_NOOPS: dict[str, tuple] = {"lora_path": (), "image_data": (), "audio_data": (), "video_data": (),
                                    "input_embeds": (), "return_hidden_states": (False,),
                                    "custom_logit_processor": (), "session_params": (), "modalities": ()}
GENERATE_FIELDS = {"text", "input_ids", "sampling_params", "rid", "return_logprob", "top_logprobs_num",
                   "logprob_start_len", "return_text_in_logprobs", "stream", *GENERATE_NOOPS}


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


def parse_sampling(sp: dict, path: str, limits: Limits, default_max_new: int, max_new_key: str = "max_new_tokens",
                   default_temperature: float = 1.0, min_new_key: str = "min_new_tokens"
                   ) -> tuple[SamplingParams, bool, bool]:
    """(SamplingParams, skip_special_tokens, no_stop_trim) from a sampling dict; `path` prefixes field names."""
    p = f"{path}." if path else ""
    temperature = get_float(sp, "temperature", f"{p}temperature", default_temperature, lo=0.0)
    max_new = get_int(sp, max_new_key, f"{p}{max_new_key}", default_max_new, lo=0, hi=limits.max_context)
    min_new = get_int(sp, min_new_key, f"{p}{min_new_key}", 0, lo=0, hi=max_new)  # no stop before it
    seed = get_int(sp, "seed", f"{p}seed", None, lo=0, hi=MAX_SEED)
    if seed is None and "sampling_seed" in sp:
        seed = get_int(sp, "sampling_seed", f"{p}sampling_seed", None, lo=0, hi=MAX_SEED)
    stop_ids = sp.get("stop_token_ids")
    params = SamplingParams(
        temperature=temperature, max_new_tokens=max_new,  # below sampling.GREEDY_BELOW is greedy
        ignore_eos=get_bool(sp, "ignore_eos", f"{p}ignore_eos", False),
        stop_token_ids=() if stop_ids is None else get_token_ids(stop_ids, f"{p}stop_token_ids", limits, True),
        stop=get_stop(sp, "stop", f"{p}stop"), seed=seed, min_new_tokens=min_new,
    )
    skip_special = get_bool(sp, "skip_special_tokens", f"{p}skip_special_tokens", True)
    get_bool(sp, "spaces_between_special_tokens", f"{p}spaces_between_special_tokens", True)  # byte tokens: no-op
    no_stop_trim = get_bool(sp, "no_stop_trim", f"{p}no_stop_trim", False)
    return params, skip_special, no_stop_trim


def parse_generate(body: dict, limits: Limits) -> GenerateCall:
    """Validate a /generate body (SGLang's GenerateReqInput, single request) into a GenerateCall."""
    reject_unknown(body, GENERATE_FIELDS, "")
    for key, allowed in GENERATE_NOOPS.items():
        check_default(body, key, key, allowed)
    _, ids = prompt_ids(body.get("text"), body.get("input_ids"), limits)
    sp = body.get("sampling_params")
    if sp is None:
        sp = {}
    if not isinstance(sp, dict):
        raise bad("sampling_params", f"must be a JSON object, got {show(sp)}")
    reject_unknown(sp, SAMPLING_FIELDS, "sampling_params")
    for key, allowed in SAMPLING_NOOPS.items():
        check_default(sp, key, f"sampling_params.{key}", allowed)
    # defaults as SGLang's: 128 new tokens, temperature 1.0 (seeded by --seed unless `seed` is given)
    params, skip_special, no_stop_trim = parse_sampling(sp, "sampling_params", limits, 128, default_temperature=1.0)
    return_logprob = get_bool(body, "return_logprob", "return_logprob", False)
    top_k = get_int(body, "top_logprobs_num", "top_logprobs_num", 0, lo=0, hi=limits.vocab_size)
    if top_k and not return_logprob:  # SGLang would silently return none: say so instead
        raise bad("top_logprobs_num", f"{top_k} without return_logprob: true; top log-probs come only with "
                                      "return_logprob (set \"return_logprob\": true, or leave top_logprobs_num out)")
    # as SGLang: with return_logprob, the prompt tokens from this position on are scored too (meta_info
    # input_token_logprobs) and the prefix match stops there; -1 (the default): output log-probs only
    start = get_int(body, "logprob_start_len", "logprob_start_len", -1, lo=-1, hi=len(ids))
    return GenerateCall(
        req=GenerateRequest(rid=check_rid(body.get("rid")), input_ids=ids, sampling=params,
                            return_logprob=return_logprob, top_logprobs_num=top_k, logprob_start_len=start),
        stream=get_bool(body, "stream", "stream", False),
        return_logprob=return_logprob, top_logprobs_num=top_k,
        return_text_in_logprobs=get_bool(body, "return_text_in_logprobs", "return_text_in_logprobs", False),
        skip_special_tokens=skip_special, no_stop_trim=no_stop_trim,
    )
