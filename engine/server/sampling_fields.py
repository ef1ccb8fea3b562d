"""The sampling fields every dialect shares: read into SamplingParams, or refused with the reason.

SGLang's `sampling_params` (/generate) and the OpenAI bodies of vLLM and SGLang
(/v1/completions, /v1/chat/completions) name the same sampling controls. Each
is either honoured (engine/sampling.py applies it as SGLang does), accepted with
any value because it changes nothing this engine computes, or accepted only at
the value that asks for nothing, any other value being a 400 that names the
field and says why this engine cannot honour it. Which names a dialect accepts
is its own table's (generate_params.py, openai_params.py); docs/server.md lists
them all.
"""

from __future__ import annotations

from engine.io_struct import SamplingParams
from engine.server.validate import (
    Limits,
    bad,
    check_unicode,
    get_bool,
    get_float,
    get_int,
    get_stop,
    get_token_ids,
    show,
)
from protocol.tokenizer import BYTE_TOKENIZER

SEED_RANGE = (-(2**63), 2**63 - 1)  # vLLM's (int64); a torch generator takes any of them
MAX_LOGIT_BIAS = 100.0  # OpenAI's range: -100..100
MAX_BAD_WORDS = 16
MAX_BAD_WORD_BYTES = 64

GRAMMAR = "constrained decoding (grammars, regular expressions, JSON schemas) is not implemented by this engine"
ONE_CHOICE = "this server answers one choice per request: send n requests (with different seeds) instead"
CUSTOM = "custom logits processors are not supported by this engine"

# field -> (the values that ask for nothing, accepted; why any other value cannot be honoured here)
REFUSED: dict[str, tuple[tuple, str]] = {
    "n": ((1,), ONE_CHOICE),
    "json_schema": ((), GRAMMAR), "regex": ((), GRAMMAR), "ebnf": ((), GRAMMAR), "structural_tag": ((), GRAMMAR),
    "stop_regex": ((), "regular-expression stops are not implemented by this engine: use stop strings"),
    "custom_params": ((), CUSTOM),
}

# Honoured: engine/sampling.py applies them (SGLang's spelling; vLLM's allowed_token_ids and bad_words where the
# dialect accepts them)
HONOURED = {"temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty",
            "logit_bias", "seed", "sampling_seed", "stop", "stop_token_ids", "ignore_eos", "skip_special_tokens",
            "no_stop_trim"}


def get_logit_bias(d: dict, key: str, path: str, limits: Limits) -> tuple[tuple[int, float], ...]:
    """`logit_bias`: {"token id": bias} (OpenAI's, vLLM's and SGLang's form), each bias in -100..100."""
    v = d.get(key)
    if v is None:
        return ()
    if not isinstance(v, dict):
        raise bad(path, f"must be an object mapping token ids (as strings) to biases, got {show(v)}")
    out = []
    for k in v:
        if not (k.isascii() and k.isdigit() and str(int(k)) == k and int(k) < limits.vocab_size):
            raise bad(path, f"keys must be token ids in 0..{limits.vocab_size - 1} written as decimal strings, "
                            f"got {show(k)}")
        b = get_float(v, k, f"{path}.{k}", 0.0, lo=-MAX_LOGIT_BIAS, hi=MAX_LOGIT_BIAS)
        if b:
            out.append((int(k), b))
    return tuple(out)


def get_bad_words(d: dict, key: str, path: str) -> tuple[tuple[int, ...], ...]:
    """vLLM's `bad_words`: strings whose byte tokens the output never completes."""
    v = d.get(key)
    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(w, str) for w in v):
        raise bad(path, f"must be a list of strings, got {show(v)}")
    if len(v) > MAX_BAD_WORDS:
        raise bad(path, f"at most {MAX_BAD_WORDS} bad words, got {len(v)}")
    words = []
    for w in v:
        ids = tuple(BYTE_TOKENIZER.encode(check_unicode(w, path)))
        if not ids or len(ids) > MAX_BAD_WORD_BYTES:
            raise bad(path, f"bad words must be 1..{MAX_BAD_WORD_BYTES} bytes long, got {show(w)}")
        words.append(ids)
    return tuple(words)


def distribution_fields(sp: dict, p: str, limits: Limits) -> dict:
    """top_p, top_k, min_p and the penalties, in SGLang's and vLLM's ranges (the union where they differ)."""
    top_p = get_float(sp, "top_p", f"{p}top_p", 1.0, lo=0.0, hi=1.0)
    if top_p == 0.0:
        raise bad(f"{p}top_p", "must be > 0 (use temperature 0 for greedy decoding), got 0.0")
    repetition = get_float(sp, "repetition_penalty", f"{p}repetition_penalty", 1.0, lo=0.0)
    if repetition == 0.0:
        raise bad(f"{p}repetition_penalty", "must be > 0 (1 is no penalty), got 0.0")
    top_k = get_int(sp, "top_k", f"{p}top_k", -1, lo=-1)  # -1 (SGLang) or 0 (vLLM): the whole vocabulary
    return dict(
        top_p=top_p, top_k=min(top_k, limits.vocab_size), repetition_penalty=repetition,
        min_p=get_float(sp, "min_p", f"{p}min_p", 0.0, lo=0.0, hi=1.0),
        frequency_penalty=get_float(sp, "frequency_penalty", f"{p}frequency_penalty", 0.0, lo=-2.0, hi=2.0),
        presence_penalty=get_float(sp, "presence_penalty", f"{p}presence_penalty", 0.0, lo=-2.0, hi=2.0),
        logit_bias=get_logit_bias(sp, "logit_bias", f"{p}logit_bias", limits),
    )


def parse_sampling(sp: dict, path: str, limits: Limits, default_max_new: int, max_new_key: str = "max_new_tokens",
                   default_temperature: float = 1.0, min_new_key: str = "min_new_tokens"
                   ) -> tuple[SamplingParams, bool, bool]:
    """(SamplingParams, skip_special_tokens, no_stop_trim) from a sampling dict; `path` prefixes field names.

    Reads every honoured field the dict holds: the dialect has already refused the names it does not accept.
    """
    p = f"{path}." if path else ""
    temperature = get_float(sp, "temperature", f"{p}temperature", default_temperature, lo=0.0)
    max_new = get_int(sp, max_new_key, f"{p}{max_new_key}", default_max_new, lo=0, hi=limits.max_context)
    min_new = get_int(sp, min_new_key, f"{p}{min_new_key}", 0, lo=0, hi=max_new)  # no stop before it
    seed = get_int(sp, "seed", f"{p}seed", None, *SEED_RANGE)
    if seed is None:
        seed = get_int(sp, "sampling_seed", f"{p}sampling_seed", None, *SEED_RANGE)
    stop_ids = sp.get("stop_token_ids")
    allowed = sp.get("allowed_token_ids")
    params = SamplingParams(
        temperature=temperature, max_new_tokens=max_new,  # below sampling.GREEDY_BELOW is greedy
        ignore_eos=get_bool(sp, "ignore_eos", f"{p}ignore_eos", False),
        stop_token_ids=() if stop_ids is None else get_token_ids(stop_ids, f"{p}stop_token_ids", limits, True),
        stop=get_stop(sp, "stop", f"{p}stop"), seed=seed, min_new_tokens=min_new, **distribution_fields(sp, p, limits),
        allowed_token_ids=None if allowed is None else get_token_ids(allowed, f"{p}allowed_token_ids", limits),
        bad_words=get_bad_words(sp, "bad_words", f"{p}bad_words"),
    )
    skip_special = get_bool(sp, "skip_special_tokens", f"{p}skip_special_tokens", True)
    get_bool(sp, "spaces_between_special_tokens", f"{p}spaces_between_special_tokens", True)  # byte tokens: no-op
    get_int(sp, "stream_interval", f"{p}stream_interval", None, lo=1)  # no-op: one chunk per engine step
    # vLLM's include_stop_str_in_output is SGLang's no_stop_trim: the matched stop string or stop token stays
    no_stop_trim = (get_bool(sp, "no_stop_trim", f"{p}no_stop_trim", False)
                    or get_bool(sp, "include_stop_str_in_output", f"{p}include_stop_str_in_output", False))
    return params, skip_special, no_stop_trim
