"""The /generate dialect (SGLang's GenerateReqInput, one request per call): its fields, honoured or refused.

Its `sampling_params` are SGLang's SamplingParams, read by sampling_fields.py;
the top-level fields SGLang accepts and this engine cannot honour are refused
at any value but the one that asks for nothing, with the reason.
docs/server.md lists the same tables.
"""

from __future__ import annotations

from engine.io_struct import GenerateRequest
from engine.server.sampling_fields import HONOURED, REFUSED, parse_sampling
from engine.server.validate import (
    GenerateCall,
    Limits,
    bad,
    check_refused,
    check_rid,
    get_bool,
    get_int,
    prompt_ids,
    reject_unknown,
    show,
)

TEXT_ONLY = "this engine serves a text-only model"
# sampling_params: SGLang's names; `n`, the grammars, stop_regex and custom_params are refused (sampling_fields.py)
SAMPLING_FIELDS = {*HONOURED, *REFUSED, "max_new_tokens", "min_new_tokens", "spaces_between_special_tokens",
                   "stream_interval"}
# top-level SGLang fields: (the values that ask for nothing, accepted; why another value cannot be honoured here)
GENERATE_REFUSED: dict[str, tuple[tuple, str]] = {
    "lora_path": ((), "LoRA adapters are not supported by this engine"),
    "image_data": ((), TEXT_ONLY), "audio_data": ((), TEXT_ONLY), "video_data": ((), TEXT_ONLY),
    "modalities": ((), TEXT_ONLY), "input_embeds": ((), "prompts are token ids or text here, not embeddings"),
    "return_hidden_states": ((False,), "hidden states are not returned by this engine"),
    "custom_logit_processor": ((), "custom logits processors are not supported by this engine"),
    "session_params": ((), "SGLang sessions are not supported: send the whole prompt (the radix cache reuses it)"),
}
GENERATE_FIELDS = {"text", "input_ids", "sampling_params", "rid", "return_logprob", "top_logprobs_num",
                   "logprob_start_len", "return_text_in_logprobs", "stream", *GENERATE_REFUSED}
DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's SamplingParams default


def parse_generate(body: dict, limits: Limits) -> GenerateCall:
    """Validate a /generate body (SGLang's GenerateReqInput, single request) into a GenerateCall."""
    reject_unknown(body, GENERATE_FIELDS, "")
    check_refused(body, GENERATE_REFUSED)
    _, ids = prompt_ids(body.get("text"), body.get("input_ids"), limits)
    sp = body.get("sampling_params")
    if sp is None:
        sp = {}
    if not isinstance(sp, dict):
        raise bad("sampling_params", f"must be a JSON object, got {show(sp)}")
    reject_unknown(sp, SAMPLING_FIELDS, "sampling_params")
    check_refused(sp, REFUSED, "sampling_params.")
    # defaults as SGLang's: 128 new tokens, temperature 1.0 (seeded by --seed unless `seed` is given)
    params, skip_special, no_stop_trim = parse_sampling(sp, "sampling_params", limits, DEFAULT_MAX_NEW_TOKENS,
                                                        default_temperature=1.0)
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
