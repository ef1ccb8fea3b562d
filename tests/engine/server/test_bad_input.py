"""Bad input: each case gets its 4xx JSON error naming the field, and the server keeps serving."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow

OK_SP = {"max_new_tokens": 1}


def gen(**kw) -> bytes:
    body = {"input_ids": [1, 2], "sampling_params": dict(OK_SP)}
    body.update(kw)
    return json.dumps(body).encode()


def sp(**kw) -> bytes:
    return gen(sampling_params=dict(OK_SP, **kw))


GENERATE_CASES = [
    # (case id, raw body, status, text the message must contain)
    ("invalid-json", b'{"text": ', 400, "body"),
    ("not-utf8", b'\xff\xfe{"text": "a"}', 400, "body"),
    ("not-an-object", b"[1, 2]", 400, "body"),
    ("too-deep", b"[" * 60_000, 400, "body"),
    ("neither-prompt", json.dumps({"sampling_params": OK_SP}).encode(), 400, "text/input_ids"),
    ("both-prompts", gen(text="hi"), 400, "text/input_ids"),
    ("text-not-str", json.dumps({"text": 5}).encode(), 400, "text"),
    ("text-empty", json.dumps({"text": ""}).encode(), 400, "text"),
    ("text-lone-surrogate", b'{"text": "\\ud800"}', 400, "text"),
    ("ids-not-list", gen(input_ids="12"), 400, "input_ids"),
    ("ids-empty", gen(input_ids=[]), 400, "input_ids"),
    ("ids-bool", gen(input_ids=[True]), 400, "input_ids"),
    ("ids-float", gen(input_ids=[1.5]), 400, "input_ids"),
    ("ids-negative", gen(input_ids=[-1]), 400, "input_ids"),
    ("ids-out-of-vocab", gen(input_ids=[1, 260]), 400, "input_ids"),
    ("ids-huge", gen(input_ids=[10**30]), 400, "input_ids"),
    ("prompt-longer-than-context", gen(input_ids=[1] * 2048), 400, "input_ids"),
    ("prompt-plus-new-over-context", gen(input_ids=[1] * 2000, sampling_params={"max_new_tokens": 100}), 400,
     "max_new_tokens"),
    ("sampling-not-object", gen(sampling_params=[1]), 400, "sampling_params"),
    ("max-new-negative", sp(max_new_tokens=-1), 400, "sampling_params.max_new_tokens"),
    ("max-new-over-limit", sp(max_new_tokens=5000), 400, "sampling_params.max_new_tokens"),
    ("max-new-bool", sp(max_new_tokens=True), 400, "sampling_params.max_new_tokens"),
    ("max-new-string", sp(max_new_tokens="3"), 400, "sampling_params.max_new_tokens"),
    ("max-new-float", sp(max_new_tokens=2.0), 400, "sampling_params.max_new_tokens"),
    ("temperature-negative", sp(temperature=-0.5), 400, "sampling_params.temperature"),
    ("temperature-string", sp(temperature="hot"), 400, "sampling_params.temperature"),
    ("temperature-bool", sp(temperature=True), 400, "sampling_params.temperature"),
    ("temperature-nan", b'{"text": "a", "sampling_params": {"temperature": NaN}}', 400, "sampling_params.temperature"),
    ("temperature-inf", b'{"text": "a", "sampling_params": {"temperature": 1e999}}', 400,
     "sampling_params.temperature"),
    ("ignore-eos-string", sp(ignore_eos="yes"), 400, "sampling_params.ignore_eos"),
    ("stop-number", sp(stop=5), 400, "sampling_params.stop"),
    ("stop-list-of-numbers", sp(stop=[1]), 400, "sampling_params.stop"),
    ("stop-empty-string", sp(stop=[""]), 400, "sampling_params.stop"),
    ("stop-token-out-of-vocab", sp(stop_token_ids=[300]), 400, "sampling_params.stop_token_ids"),
    ("seed-negative", sp(seed=-1), 400, "sampling_params.seed"),
    ("seed-too-big", sp(seed=2**64), 400, "sampling_params.seed"),
    ("seed-float", sp(seed=1.5), 400, "sampling_params.seed"),
    ("sampling-unknown-field", sp(frobnicate=1), 400, "sampling_params.frobnicate"),
    ("top-p-unsupported", sp(top_p=0.9), 400, "sampling_params.top_p"),
    ("top-k-unsupported", sp(top_k=5), 400, "sampling_params.top_k"),
    ("skip-special-string", sp(skip_special_tokens="no"), 400, "sampling_params.skip_special_tokens"),
    ("top-level-unknown", gen(frobnicate=1), 400, "frobnicate"),
    ("lora-path-set", gen(lora_path="adapter"), 400, "lora_path"),
    ("return-logprob-string", gen(return_logprob="yes"), 400, "return_logprob"),
    ("top-logprobs-negative", gen(return_logprob=True, top_logprobs_num=-1), 400, "top_logprobs_num"),
    ("top-logprobs-over-vocab", gen(return_logprob=True, top_logprobs_num=1000), 400, "top_logprobs_num"),
    ("top-logprobs-bool", gen(return_logprob=True, top_logprobs_num=True), 400, "top_logprobs_num"),
    ("logprob-start-len", gen(logprob_start_len=-5), 400, "logprob_start_len"),
    ("stream-string", gen(stream="true"), 400, "stream"),
    ("rid-number", gen(rid=5), 400, "rid"),
    ("rid-batch", gen(rid=["a", "b"]), 400, "rid"),
    ("rid-empty", gen(rid=""), 400, "rid"),
]


@pytest.mark.parametrize("raw,status,needle", [c[1:] for c in GENERATE_CASES], ids=[c[0] for c in GENERATE_CASES])
def test_generate_rejects(server, raw, status, needle):
    r = server.call("POST", "/generate", raw=raw)
    assert r.status == status, r.body
    err = r.json()["error"]
    assert needle in err["message"], err


def comp(**kw) -> bytes:
    body = {"model": "m", "prompt": "hi", "max_tokens": 1}
    body.update(kw)
    return json.dumps({k: v for k, v in body.items() if v is not ...}).encode()


COMPLETION_CASES = [
    ("missing-prompt", comp(prompt=...), 400, "prompt"),
    ("prompt-number", comp(prompt=5), 400, "prompt"),
    ("prompt-batch", comp(prompt=["a", "b"]), 400, "prompt"),
    ("prompt-token-out-of-vocab", comp(prompt=[1, 999]), 400, "prompt"),
    ("max-tokens-negative", comp(max_tokens=-1), 400, "max_tokens"),
    ("max-tokens-bool", comp(max_tokens=False), 400, "max_tokens"),
    ("temperature-string", comp(temperature="0"), 400, "temperature"),
    ("logprobs-too-many", comp(logprobs=100), 400, "logprobs"),
    ("logprobs-bool", comp(logprobs=True), 400, "logprobs"),
    ("n-two", comp(n=2), 400, "n"),
    ("echo", comp(echo=True), 400, "echo"),
    ("unknown-field", comp(frobnicate=[]), 400, "frobnicate"),
    ("model-number", comp(model=3), 400, "model"),
    ("stream-options-without-stream", comp(stream_options={"include_usage": True}), 400, "stream_options"),
    ("stop-too-many", comp(stop=["a"] * 17), 400, "stop"),
]


@pytest.mark.parametrize("raw,status,needle", [c[1:] for c in COMPLETION_CASES],
                         ids=[c[0] for c in COMPLETION_CASES])
def test_completions_reject(server, raw, status, needle):
    r = server.call("POST", "/v1/completions", raw=raw)
    assert r.status == status, r.body
    assert needle in r.json()["error"]["message"]


def test_oversize_body_is_413(server):
    big = json.dumps({"text": "a" * 70_000}).encode()  # the server runs with --max-body-bytes 65536
    r = server.call("POST", "/generate", raw=big)
    assert r.status == 413 and "body" in r.json()["error"]["message"]
    conn = server.connect()  # chunked: no Content-Length to check up front
    try:
        conn.request("POST", "/v1/completions", body=iter([big[:40_000], big[40_000:]]), headers=server.headers(),
                     encode_chunked=True)
        resp = conn.getresponse()
        assert resp.status == 413 and "body" in json.loads(resp.read())["error"]["message"]
    finally:
        conn.close()


def test_unknown_route_and_method(server):
    r = server.call("GET", "/nope")
    assert r.status == 404 and "/nope" in r.json()["error"]["message"]
    r = server.call("GET", "/generate")
    assert r.status == 405 and "error" in r.json()


def test_still_serving_after_bad_input(server):
    assert server.call("GET", "/health").status == 200
    assert server.generate(input_ids=[1, 2], sampling_params=OK_SP)["meta_info"]["completion_tokens"] == 1
