"""Property-based fuzz of request bodies: every answer is a 4xx JSON error or a valid result, never a 5xx.

Valid bodies ask for at most 4 new tokens, so the run stays short on a CPU.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from protocol.tokenizer import BYTE_TOKENIZER_DIR

pytestmark = pytest.mark.slow

FUZZ = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# the served id of random weights and its aliases (another name is a 404)
MODELS = st.sampled_from([str(BYTE_TOKENIZER_DIR), "random", "random-tiny"])
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=12))
junk = st.recursive(scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                    max_leaves=6)
# absent sampling params mean 128 new tokens: too slow for a fuzz run, so mutations never produce them
not_empty_junk = junk.filter(lambda v: v is not None and v != {})
token_ids = st.lists(st.integers(0, 259), min_size=1, max_size=40)
# the length field is only ever small or invalid (never a valid large value)
small_new = st.one_of(st.integers(0, 4), st.integers(max_value=-1), st.integers(min_value=2049), st.booleans(),
                      st.floats(), st.text(max_size=3))

# what shapes the distribution, every value in range (a request may then ban every token but the one it allows)
distribution_fields = {
    "top_p": st.floats(0.01, 1), "top_k": st.integers(-1, 300), "min_p": st.floats(0, 1),
    "frequency_penalty": st.floats(-2, 2), "presence_penalty": st.floats(-2, 2),
    "repetition_penalty": st.floats(0.1, 3),
    "logit_bias": st.dictionaries(st.integers(0, 259).map(str), st.floats(-100, 100), max_size=3),
}
valid_sampling = st.fixed_dictionaries({"max_new_tokens": st.integers(0, 4)}, optional={
    "temperature": st.floats(0, 2), "ignore_eos": st.booleans(), "seed": st.integers(0, 2**63 - 1),
    "stop": st.one_of(st.text(min_size=1, max_size=4), st.lists(st.text(min_size=1, max_size=4), max_size=3)),
    "stop_token_ids": st.lists(st.integers(0, 259), max_size=3), "skip_special_tokens": st.booleans(),
    "no_stop_trim": st.booleans(), **distribution_fields,
})
valid_generate = st.fixed_dictionaries(
    {"sampling_params": valid_sampling},
    optional={"rid": st.uuids().map(str), "return_logprob": st.booleans(), "top_logprobs_num": st.integers(0, 5),
              "logprob_start_len": st.just(-1), "stream": st.booleans(), "return_text_in_logprobs": st.booleans()},
).map(lambda b: b if b.get("return_logprob") or not b.get("top_logprobs_num") else dict(b, return_logprob=True)
      ).flatmap(lambda body: st.one_of(st.text(min_size=1, max_size=40).map(lambda t: dict(body, text=t)),
                                       token_ids.map(lambda ids: dict(body, input_ids=ids))))
valid_completion = st.fixed_dictionaries(
    {"prompt": st.one_of(st.text(min_size=1, max_size=40), token_ids), "max_tokens": st.integers(0, 4)},
    optional={"model": MODELS, "temperature": st.floats(0, 2), "logprobs": st.integers(0, 5),
              "stream": st.booleans(), "stop": st.text(min_size=1, max_size=3), "seed": st.integers(0, 10),
              "echo": st.just(False), "ignore_eos": st.booleans(), "n": st.just(1), "user": st.text(max_size=5),
              **distribution_fields, "allowed_token_ids": st.lists(st.integers(0, 259), min_size=1, max_size=3),
              "bad_words": st.lists(st.text(min_size=1, max_size=3), max_size=2),
              "include_stop_str_in_output": st.booleans()},
).map(lambda b: dict(b, stream_options={"include_usage": True}) if b.get("stream") else b)

text_parts = st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=10)}), max_size=2)
chat_message = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "developer"]),
                                      "content": st.one_of(st.text(max_size=20), text_parts)})
valid_chat = st.fixed_dictionaries(
    {"messages": st.lists(chat_message, min_size=1, max_size=3), "max_completion_tokens": st.integers(0, 4)},
    optional={"model": MODELS, "temperature": st.floats(0, 2), "stream": st.booleans(),
              "logprobs": st.booleans(), "ignore_eos": st.booleans(), "min_tokens": st.integers(0, 0),
              "return_token_ids": st.booleans(), "seed": st.integers(0, 10), "nvext": st.just({"ignore_eos": True}),
              "chat_template_kwargs": st.just({"enable_thinking": False}), **distribution_fields},
).map(lambda b: dict(b, stream_options={"include_usage": True, "continuous_usage_stats": True})
      if b.get("stream") else b)

GENERATE_KEYS = ["text", "input_ids", "rid", "return_logprob", "top_logprobs_num", "logprob_start_len", "stream",
                 "return_text_in_logprobs", "lora_path"]
SAMPLING_KEYS = ["temperature", "ignore_eos", "stop", "stop_token_ids", "seed", "top_p", "top_k",
                 "skip_special_tokens", "no_stop_trim", "n", "min_p", "logit_bias", "repetition_penalty", "regex"]
COMPLETION_KEYS = ["prompt", "model", "temperature", "logprobs", "stream", "stop", "seed", "echo", "n",
                   "stream_options", "ignore_eos", "top_p", "logit_bias", "allowed_token_ids", "bad_words",
                   "min_tokens"]


@st.composite
def mutated(draw, valid, top_keys, nested: str | None, nested_keys, length_key: str):
    """(body, is_valid): a valid body, or one with 1-3 fields set to junk or removed."""
    body = draw(valid)
    n = draw(st.integers(0, 3))
    for _ in range(n):
        inner = body.get(nested) if nested else None
        into_nested = isinstance(inner, dict) and draw(st.booleans())
        target, keys = (inner, nested_keys) if into_nested else (body, top_keys)
        key = draw(st.one_of(st.sampled_from(keys), st.text(max_size=6)))
        if key == length_key:
            target[key] = draw(small_new)
        elif key == nested:
            target[key] = draw(not_empty_junk)
        elif draw(st.booleans()):
            target[key] = draw(junk)
        else:
            target.pop(key, None)
    return body, n == 0


generate_bodies = mutated(valid_generate, GENERATE_KEYS + ["sampling_params"], "sampling_params",
                          SAMPLING_KEYS + ["max_new_tokens"], "max_new_tokens")
completion_bodies = mutated(valid_completion, COMPLETION_KEYS + ["max_tokens"], None, [], "max_tokens")
CHAT_KEYS = ["messages", "model", "temperature", "logprobs", "top_logprobs", "stream", "stop", "seed", "n",
             "stream_options", "ignore_eos", "min_tokens", "return_token_ids", "nvext", "add_generation_prompt",
             "continue_final_message", "tools", "response_format"]
chat_bodies = mutated(valid_chat, CHAT_KEYS + ["max_completion_tokens"], None, [], "max_completion_tokens")


def encode(body: dict) -> bytes:
    return json.dumps(body, allow_nan=True).encode("utf-8", errors="surrogatepass")


def check_error(r) -> None:
    assert 400 <= r.status < 500, (r.status, r.body[:500])
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"]


def check_generate_answer(ans: dict, final: bool, total: int) -> None:
    """`total`: output ids so far (streamed chunks are incremental, `completion_tokens` cumulative)."""
    assert isinstance(ans["text"], str) and all(isinstance(t, int) for t in ans["output_ids"])
    meta = ans["meta_info"]
    assert meta["completion_tokens"] == total
    assert (meta["finish_reason"] is not None) == final
    assert {"id", "prompt_tokens", "cached_tokens", "e2e_latency", "spec_trace"} <= set(meta)


def check_reply(r, stream: bool, check) -> None:
    if r.status != 200:
        check_error(r)
        return
    if not stream:
        ans = r.json()
        check(ans, True, len(ans.get("output_ids", ())))
        return
    events = r.events()
    assert events[-1] == "[DONE]"
    total = 0
    for i, e in enumerate(events[:-1]):
        total += len(e.get("output_ids", ()))
        check(e, i == len(events) - 2, total)


def check_completion(ans: dict, final: bool, total: int) -> None:
    assert ans["object"] == "text_completion"
    if ans["choices"]:
        (choice,) = ans["choices"]
        assert isinstance(choice["text"], str)
        assert choice["finish_reason"] in ((None, "length", "stop") if not final else ("length", "stop"))
    else:
        assert ans["usage"]["total_tokens"] >= 1  # stream_options.include_usage chunk


@FUZZ
@given(case=generate_bodies)
def test_fuzz_generate(server, case):
    body, valid = case
    r = server.call("POST", "/generate", raw=encode(body))
    event(f"status {r.status}")
    assert r.status == 200 or not valid, r.body[:300]
    check_reply(r, body.get("stream") is True, check_generate_answer)


@FUZZ
@given(case=completion_bodies)
def test_fuzz_completions(server, case):
    body, valid = case
    r = server.call("POST", "/v1/completions", raw=encode(body))
    event(f"status {r.status}")
    assert r.status == 200 or not valid, r.body[:300]
    check_reply(r, body.get("stream") is True, check_completion)


@settings(FUZZ, max_examples=60)
@given(raw=st.binary(max_size=200), path=st.sampled_from(["/generate", "/v1/completions", "/flush_cache"]))
def test_fuzz_raw_bytes(server, raw, path):
    r = server.call("POST", path, raw=raw)
    assert r.status < 500, r.body[:300]


def test_healthy_after_fuzz(server):
    assert server.call("GET", "/health").status == 200
    assert server.metrics()["specgate_engine_healthy"] == 1


def check_chat(ans: dict, final: bool, total: int) -> None:
    assert ans["object"] in ("chat.completion", "chat.completion.chunk")
    if ans["choices"]:
        (choice,) = ans["choices"]
        msg = choice.get("message") or choice["delta"]
        assert isinstance(msg.get("content", ""), str)
        assert choice["finish_reason"] in ((None, "length", "stop") if not final else ("length", "stop"))
    else:
        assert ans["usage"]["total_tokens"] >= 1


@FUZZ
@given(case=chat_bodies)
def test_fuzz_chat(server, case):
    body, valid = case
    r = server.call("POST", "/v1/chat/completions", raw=encode(body))
    event(f"status {r.status}")
    assert r.status == 200 or not valid, r.body[:300]
    check_reply(r, body.get("stream") is True, check_chat)
