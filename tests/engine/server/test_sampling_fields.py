"""The sampling fields of /generate, /v1/completions and /v1/chat/completions, field by field, from the tables:
honoured ones land in SamplingParams, ignored ones are accepted with any value, refused ones are accepted at
their no-op value only and otherwise refused with a 400 that names the field and says why; docs/server.md names
every one. (What the honoured fields do to the tokens: test_sampling_effects.py and tests/engine/test_sampling.py.)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine.server import openai_params
from engine.server.chat import CHAT_DEFAULT_MAX_TOKENS, parse_chat
from engine.server.generate_params import GENERATE_REFUSED, parse_generate
from engine.server.openai import parse_completion
from engine.server.sampling_fields import REFUSED
from engine.server.validate import ApiError, Limits

LIMITS = Limits(vocab_size=260, max_context=2048)
DOCS = (Path(__file__).resolve().parents[3] / "docs" / "server.md").read_text()


def generate(**sampling):
    return parse_generate({"text": "hi", "sampling_params": sampling}, LIMITS)


def generate_top(**fields):
    return parse_generate({"text": "hi", **fields}, LIMITS)


def completion(**fields):
    return parse_completion({"prompt": "hi", **fields}, LIMITS)[0]


def chat(**fields):
    return parse_chat({"messages": [{"role": "user", "content": "hi"}], **fields}, LIMITS)[0]


# (dialect, parser of one field, prefix of its name in errors, the table of what it refuses)
DIALECTS = [
    ("generate", generate, "sampling_params.", REFUSED),
    ("generate-top", generate_top, "", GENERATE_REFUSED),
    ("completions", completion, "", {**openai_params.REFUSED, **openai_params.COMPLETION_REFUSED}),
    ("chat", chat, "", {**openai_params.REFUSED, **openai_params.CHAT_REFUSED}),
]


def other_value(allowed: tuple):
    """A value that asks for something: not one of the no-op values."""
    return next(v for v in (2, "x", {"type": "json_object"}, [{"type": "function"}])
                if not any(type(v) is type(a) and v == a for a in allowed))


REFUSAL_CASES = [(name, parse, prefix, field, allowed, reason)
                 for name, parse, prefix, table in DIALECTS for field, (allowed, reason) in table.items()]


@pytest.mark.parametrize("parse,prefix,field,allowed,reason", [c[1:] for c in REFUSAL_CASES],
                         ids=[f"{c[0]}-{c[3]}" for c in REFUSAL_CASES])
def test_refused_fields_name_the_field_and_say_why(parse, prefix, field, allowed, reason):
    for value in (None, *allowed):  # the values that ask for nothing are accepted
        parse(**{field: value})
    with pytest.raises(ApiError) as e:
        parse(**{field: other_value(allowed)})
    assert e.value.status == 400 and e.value.param == f"{prefix}{field}"
    assert e.value.message.startswith(f"{prefix}{field}: {reason} (only "), e.value.message


IGNORED_VALUES = {"spaces_between_special_tokens": False, "stream_interval": 4}  # typed: checked, then ignored


@pytest.mark.parametrize("parse", [completion, chat], ids=["completions", "chat"])
@pytest.mark.parametrize("field", sorted(openai_params.IGNORED))
def test_ignored_fields_are_accepted_with_any_value(parse, field):
    call = parse(**{field: IGNORED_VALUES.get(field, "anything")})
    assert call.req.sampling == parse().req.sampling


def test_generate_ignores_what_changes_nothing_here():
    assert generate(spaces_between_special_tokens=False, stream_interval=3).req.sampling == generate().req.sampling


# (field, value, what SamplingParams holds): the same on every dialect that accepts the field
HONOURED = [
    ("top_p", 0.9, {"top_p": 0.9}),
    ("top_k", 5, {"top_k": 5}),
    ("top_k", 0, {"top_k": 0}),  # vLLM's "all"
    ("top_k", 10**12, {"top_k": 260}),  # more than the vocabulary is all of it
    ("min_p", 0.2, {"min_p": 0.2}),
    ("frequency_penalty", -1.5, {"frequency_penalty": -1.5}),
    ("presence_penalty", 2, {"presence_penalty": 2.0}),
    ("repetition_penalty", 3.5, {"repetition_penalty": 3.5}),  # vLLM has no upper bound (SGLang stops at 2)
    ("logit_bias", {"97": 5, "98": 0, "259": -100}, {"logit_bias": ((97, 5.0), (259, -100.0))}),
    ("seed", -7, {"seed": -7}),  # vLLM's int64 range
    ("stop", "ab", {"stop": ("ab",)}),
    ("stop_token_ids", [98], {"stop_token_ids": (98,)}),
    ("ignore_eos", True, {"ignore_eos": True}),
]
OPENAI_HONOURED = [
    ("allowed_token_ids", [97, 98], {"allowed_token_ids": (97, 98)}),
    ("bad_words", ["ab", "é"], {"bad_words": ((97, 98), (0xC3, 0xA9))}),
    ("min_tokens", 3, {"min_new_tokens": 3}),
]


@pytest.mark.parametrize("parse", [generate, completion, chat], ids=["generate", "completions", "chat"])
@pytest.mark.parametrize("field,value,want", HONOURED, ids=[f"{c[0]}={c[1]}" for c in HONOURED])
def test_honoured_fields_reach_the_engine(parse, field, value, want):
    sp = parse(**{field: value}).req.sampling
    assert {k: getattr(sp, k) for k in want} == want


@pytest.mark.parametrize("parse", [completion, chat], ids=["completions", "chat"])
@pytest.mark.parametrize("field,value,want", OPENAI_HONOURED, ids=[c[0] for c in OPENAI_HONOURED])
def test_vllm_fields_reach_the_engine(parse, field, value, want):
    sp = parse(**{field: value}).req.sampling
    assert {k: getattr(sp, k) for k in want} == want


def test_sampling_seed_and_stop_trimming_spellings():
    assert generate(sampling_seed=9).req.sampling.seed == 9
    assert generate(no_stop_trim=True).no_stop_trim and completion(no_stop_trim=True).no_stop_trim
    assert completion(include_stop_str_in_output=True).no_stop_trim
    assert chat(include_stop_str_in_output=True).no_stop_trim
    assert not completion(include_stop_str_in_output=False).no_stop_trim


# (field, bad value, the message after "<field>: ")
OUT_OF_RANGE = [
    ("top_p", 0, "must be > 0 (use temperature 0 for greedy decoding), got 0.0"),
    ("top_p", 1.5, "must be <= 1.0, got 1.5"),
    ("top_p", "high", 'must be a number, got "high"'),
    ("top_k", -2, "must be >= -1, got -2"),
    ("top_k", 2.5, "must be an integer, got 2.5"),
    ("min_p", 1.1, "must be <= 1.0, got 1.1"),
    ("frequency_penalty", 2.5, "must be <= 2.0, got 2.5"),
    ("presence_penalty", -3, "must be >= -2.0, got -3.0"),
    ("repetition_penalty", 0, "must be > 0 (1 is no penalty), got 0.0"),
    ("logit_bias", [1], "must be an object mapping token ids (as strings) to biases, got [1]"),
    ("logit_bias", {"a": 1}, 'keys must be token ids in 0..259 written as decimal strings, got "a"'),
    ("logit_bias", {"260": 1}, 'keys must be token ids in 0..259 written as decimal strings, got "260"'),
    ("logit_bias", {"007": 1}, 'keys must be token ids in 0..259 written as decimal strings, got "007"'),
    ("seed", 2**63, "must be <= 9223372036854775807, got 9223372036854775808"),
    ("stream_interval", 0, "must be >= 1, got 0"),
]


@pytest.mark.parametrize("parse,prefix", [(generate, "sampling_params."), (completion, ""), (chat, "")],
                         ids=["generate", "completions", "chat"])
@pytest.mark.parametrize("field,value,message", OUT_OF_RANGE, ids=[f"{c[0]}={c[1]}" for c in OUT_OF_RANGE])
def test_out_of_range_values_are_refused(parse, prefix, field, value, message):
    with pytest.raises(ApiError) as e:
        parse(**{field: value})
    assert e.value.message == f"{prefix}{field}: {message}"


def test_logit_bias_values_are_checked_one_by_one():
    with pytest.raises(ApiError, match=r"^logit_bias\.97: must be <= 100\.0, got 101\.0$"):
        completion(logit_bias={"97": 101})


@pytest.mark.parametrize("field,value,message", [
    ("allowed_token_ids", [], "must not be empty"),
    ("allowed_token_ids", [999], "token id 999 is outside the vocabulary (0..259)"),
    ("bad_words", "ab", 'must be a list of strings, got "ab"'),
    ("bad_words", [""], 'bad words must be 1..64 bytes long, got ""'),
    ("bad_words", ["a"] * 17, "at most 16 bad words, got 17"),
])
def test_vllm_fields_out_of_range(field, value, message):
    with pytest.raises(ApiError) as e:
        completion(**{field: value})
    assert e.value.message == f"{field}: {message}"


def test_generate_does_not_take_vllm_only_fields():
    for field in ("allowed_token_ids", "bad_words", "include_stop_str_in_output"):
        with pytest.raises(ApiError, match=rf"^sampling_params\.{field}: unknown field"):
            generate(**{field: None})


def test_chat_without_max_tokens_stops_at_the_documented_default():
    assert chat().req.sampling.max_new_tokens == CHAT_DEFAULT_MAX_TOKENS == 128
    long = parse_chat({"messages": [{"role": "user", "content": "x" * 2000}]}, LIMITS)[0]
    assert len(long.req.input_ids) + long.req.sampling.max_new_tokens == 2048  # the room the prompt leaves
    assert chat(max_tokens=300).req.sampling.max_new_tokens == 300
    assert chat(max_completion_tokens=5, max_tokens=300).req.sampling.max_new_tokens == 5
    assert completion().req.sampling.max_new_tokens == 16 and generate().req.sampling.max_new_tokens == 128


def test_docs_name_every_field_of_every_table():
    tables = [REFUSED, GENERATE_REFUSED, openai_params.REFUSED, openai_params.COMPLETION_REFUSED,
              openai_params.CHAT_REFUSED, openai_params.IGNORED, openai_params.HONOURED]
    documented = set(re.findall(r"`([a-z_]+)`", DOCS))
    missing = sorted({f for table in tables for f in table} - documented)
    assert not missing, f"docs/server.md does not name: {missing}"
