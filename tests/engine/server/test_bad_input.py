"""Bad input: each case gets its 4xx JSON error naming the field, and the server keeps serving.

The tables run in process: the aiohttp app of `make_app` over a real AsyncEngine
(tiny random model), so the checks that depend on the engine (vocabulary,
context length, KV-pool capacity) are the real ones. A handful of cases also go
over HTTP to the subprocess server of conftest.py, as a client sends them.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import ClientTimeout
from aiohttp.test_utils import TestClient, TestServer

from engine.config import EngineConfig
from engine.server.app import make_app
from engine.server.async_engine import AsyncEngine
from tests.engine.server.client import API_KEY

OK_SP = {"max_new_tokens": 1}
MAX_BODY = 65536  # as the subprocess server's --max-body-bytes
# as conftest.py's server, with a KV pool of 64 pages of 16 tokens so that capacity can be exceeded
ENGINE = EngineConfig(model_path="random", model_preset="tiny", speculative_algorithm="DFLASH",
                      mamba_track_interval=64, page_size=16, max_total_tokens=1024)
CALL_TIMEOUT = ClientTimeout(total=30)
HEADERS = {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"}


class InProcess:
    """make_app over a real AsyncEngine, on an event loop this test module drives itself."""

    def __init__(self) -> None:
        self.engine = AsyncEngine(ENGINE)
        self.loop = asyncio.new_event_loop()
        self.client = self.loop.run_until_complete(self._start())

    async def _start(self) -> TestClient:
        client = TestClient(TestServer(make_app(self.engine, api_key=API_KEY, max_body_bytes=MAX_BODY)))
        await client.start_server()
        return client

    def call(self, method: str, path: str, raw: bytes | None = None) -> tuple[int, dict]:
        """(status, JSON body) of one request."""
        async def go():
            # a refusal is immediate; a request the engine took but can never run would wait forever
            r = await self.client.request(method, path, data=raw, headers=HEADERS, timeout=CALL_TIMEOUT)
            return r.status, await r.json()

        return self.loop.run_until_complete(go())

    def close(self) -> None:
        self.loop.run_until_complete(self.client.close())
        self.loop.close()
        self.engine.shutdown()


@pytest.fixture(scope="module")
def app():
    srv = InProcess()
    yield srv
    srv.close()


def gen(**kw) -> bytes:
    body = {"input_ids": [1, 2], "sampling_params": dict(OK_SP)}
    body.update(kw)
    return json.dumps(body).encode()


def sp(**kw) -> bytes:
    return gen(sampling_params=dict(OK_SP, **kw))


GENERATE_CASES = [
    # (case id, raw body, status, the field the error names)
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
    ("seed-too-small", sp(seed=-(2**63) - 1), 400, "sampling_params.seed"),
    ("seed-too-big", sp(seed=2**64), 400, "sampling_params.seed"),
    ("seed-float", sp(seed=1.5), 400, "sampling_params.seed"),
    ("sampling-unknown-field", sp(frobnicate=1), 400, "sampling_params.frobnicate"),
    ("top-p-over-one", sp(top_p=1.5), 400, "sampling_params.top_p"),
    ("top-k-below-minus-one", sp(top_k=-2), 400, "sampling_params.top_k"),
    ("n-two", sp(n=2), 400, "sampling_params.n"),
    ("regex", sp(regex="a+"), 400, "sampling_params.regex"),
    ("skip-special-string", sp(skip_special_tokens="no"), 400, "sampling_params.skip_special_tokens"),
    ("top-level-unknown", gen(frobnicate=1), 400, "frobnicate"),
    ("lora-path-set", gen(lora_path="adapter"), 400, "lora_path"),
    ("return-logprob-string", gen(return_logprob="yes"), 400, "return_logprob"),
    ("top-logprobs-negative", gen(return_logprob=True, top_logprobs_num=-1), 400, "top_logprobs_num"),
    ("top-logprobs-over-vocab", gen(return_logprob=True, top_logprobs_num=1000), 400, "top_logprobs_num"),
    ("top-logprobs-bool", gen(return_logprob=True, top_logprobs_num=True), 400, "top_logprobs_num"),
    ("top-logprobs-without-return-logprob", gen(top_logprobs_num=2), 400, "top_logprobs_num"),
    ("top-logprobs-with-return-logprob-false", gen(return_logprob=False, top_logprobs_num=1), 400, "top_logprobs_num"),
    ("logprob-start-len", gen(logprob_start_len=-5), 400, "logprob_start_len"),
    ("stream-string", gen(stream="true"), 400, "stream"),
    ("rid-number", gen(rid=5), 400, "rid"),
    ("rid-batch", gen(rid=["a", "b"]), 400, "rid"),
    ("rid-empty", gen(rid=""), 400, "rid"),
    ("oversize-body", json.dumps({"text": "a" * 70_000}).encode(), 413, "body"),
]


def assert_names(status: int, body: dict, want_status: int, field: str) -> None:
    """The exact status, and an error whose message starts with the field and whose param is it."""
    assert status == want_status, body
    err = body["error"]
    assert err["message"].startswith(f"{field}: "), err
    assert (err["param"], err["code"]) == (field, want_status), err


@pytest.mark.parametrize("raw,status,field", [c[1:] for c in GENERATE_CASES], ids=[c[0] for c in GENERATE_CASES])
def test_generate_rejects(app, raw, status, field):
    assert_names(*app.call("POST", "/generate", raw), status, field)


def comp(**kw) -> bytes:
    body = {"model": "random-tiny", "prompt": "hi", "max_tokens": 1}
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
    ("oversize-body", comp(prompt="a" * 70_000), 413, "body"),
]


@pytest.mark.parametrize("raw,status,field", [c[1:] for c in COMPLETION_CASES],
                         ids=[c[0] for c in COMPLETION_CASES])
def test_completions_reject(app, raw, status, field):
    assert_names(*app.call("POST", "/v1/completions", raw), status, field)


ENGINE_CASES = [
    # (case id, path, raw body, the whole message): refused by the engine's own checks (Engine.validate)
    ("prompt-plus-new-over-context", "/generate", gen(input_ids=[1] * 2000, sampling_params={"max_new_tokens": 100}),
     "prompt (2000 tokens) + max_new_tokens (100) = 2100 exceeds the context length 2048"),
    ("over-kv-pool", "/generate", gen(input_ids=[1] * 1000, sampling_params={"max_new_tokens": 100}),
     "max_new_tokens: request needs 70 KV pages, the pool has 64"),  # ceil((1000 + 100 + 8) / 16)
    ("completion-over-kv-pool", "/v1/completions", comp(prompt="a" * 1000, max_tokens=100),
     "max_new_tokens: request needs 70 KV pages, the pool has 64"),
]


@pytest.mark.parametrize("path,raw,message", [c[1:] for c in ENGINE_CASES], ids=[c[0] for c in ENGINE_CASES])
def test_engine_refuses_what_does_not_fit(app, path, raw, message):
    status, body = app.call("POST", path, raw)
    assert status == 400, body
    assert body["error"]["message"] == message


def test_unknown_route_and_method(app):
    status, body = app.call("GET", "/nope")
    assert status == 404 and body["error"]["message"] == "GET /nope: Not Found"
    status, body = app.call("GET", "/generate")
    assert status == 405 and body["error"]["message"] == "GET /generate: Method Not Allowed"


def test_still_serving_after_bad_input(app):
    """No bad request reached the engine loop, and a good one is answered."""
    sched = app.engine.engine.sched
    assert sched.counters["requests"] == 0
    status, body = app.call("GET", "/health")
    assert (status, body) == (200, {"status": "ok"})
    status, body = app.call("POST", "/generate", gen())
    assert status == 200 and body["meta_info"]["completion_tokens"] == 1
    assert sched.counters["requests"] == 1


def test_top_logprobs_num_needs_return_logprob(app):
    """docs/server.md: top_logprobs_num only with return_logprob. A 400 naming both, where SGLang would answer
    without any top log-probs; its no-op value 0 (or null) stays accepted without return_logprob."""
    status, body = app.call("POST", "/generate", gen(top_logprobs_num=2))
    assert status == 400
    assert body["error"]["message"] == ('top_logprobs_num: 2 without return_logprob: true; top log-probs come only '
                                        'with return_logprob (set "return_logprob": true, or leave top_logprobs_num '
                                        'out)')
    for extra in ({"top_logprobs_num": 0}, {"top_logprobs_num": None},
                  {"return_logprob": False, "top_logprobs_num": 0}):
        status, body = app.call("POST", "/generate", gen(**extra))
        assert status == 200 and "output_top_logprobs" not in body["meta_info"], (extra, body)
    status, body = app.call("POST", "/generate", gen(return_logprob=True, top_logprobs_num=2))
    assert status == 200 and [len(t) for t in body["meta_info"]["output_top_logprobs"]] == [2]


# --- over HTTP, against the subprocess server -------------------------------------------------------
HTTP_CASES = [
    ("invalid-json", "/generate", b'{"text": ', "body"),
    ("unknown-field", "/generate", gen(frobnicate=1), "frobnicate"),
    ("out-of-vocab", "/v1/completions", comp(prompt=[1, 999]), "prompt"),
]


@pytest.mark.slow
@pytest.mark.parametrize("path,raw,field", [c[1:] for c in HTTP_CASES], ids=[c[0] for c in HTTP_CASES])
def test_http_rejects(server, path, raw, field):
    r = server.call("POST", path, raw=raw)
    assert_names(r.status, r.json(), 400, field)


@pytest.mark.slow
def test_http_oversize_body_is_413(server):
    big = json.dumps({"text": "a" * 70_000}).encode()  # the server runs with --max-body-bytes 65536
    r = server.call("POST", "/generate", raw=big)
    assert_names(r.status, r.json(), 413, "body")
    conn = server.connect()  # chunked: no Content-Length to check up front
    try:
        conn.request("POST", "/v1/completions", body=iter([big[:40_000], big[40_000:]]), headers=server.headers(),
                     encode_chunked=True)
        resp = conn.getresponse()
        assert_names(resp.status, json.loads(resp.read()), 413, "body")
    finally:
        conn.close()


@pytest.mark.slow
def test_http_still_serving_after_bad_input(server):
    assert server.call("GET", "/health").status == 200
    assert server.generate(input_ids=[1, 2], sampling_params=OK_SP)["meta_info"]["completion_tokens"] == 1
