"""SGLang's wire contract, on a real SGLang and on the stub server of these tests, through the harness's backend.

The same tests run on two targets: `sglang`, a real SGLang (`make sglang`: 0.5.23 on CPU, a tiny Llama built
here by `python -m harness.models build`, fp32), and `stub`, tests/harness/fake_server.py, which the other
harness tests use in its place. Each target runs two servers, SGLang's default cumulative streaming and
`--incremental-streaming-output`: the second is a server flag, and the two start together. What is checked,
through harness/backends/sglang.py (`SGLangBackend`: probe, payload, generate, flush, health) and on the raw
wire with aiohttp where the contract is about the format: /generate with input_ids, return_logprob and
top_logprobs_num 2; both stream formats; cached_tokens on a repeated prefix (a radix hit) and after
/flush_cache; /server_info, /get_server_info, /model_info, /health; the error bodies. The real server's
answers must also equal transformers' own greedy continuation of the same ids (reference.json of the
build), an oracle independent of SGLang.

Without `.venv-sglang` the `sglang` cases skip (and fail under SPECGATE_REQUIRE_SGLANG=1, as in CI).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from harness.backends import RequestError, make_backend
from harness.backends.sglang import TOP_K
from tests.harness import server_infos
from tests.harness.fake_server import TOP1_LOGPROB, TOP2_GAP, fake_tokens
from tests.harness.test_external import servers as stub_servers
from tests.sglang_setup.server import sglang_python, sglang_servers, shared_llama

pytestmark = pytest.mark.slow
CONTEXT = 4096  # the built Llama's max_position_embeddings, which SGLang takes as its context length
N = 24  # new tokens per request: reference.json's length
# SGLang on CPU, as shared/reference/sglang-cpu.md says; --dtype float32 since SGLang serves an fp32 checkpoint
# as fp16 under its default --dtype auto (so would its log-probs be, ~4e-3 off transformers' fp32).
SGLANG_FLAGS = ("--dtype", "float32")
# The stub as a non-hybrid model: every token cached (interval 1), no speculation, SGLang's context length.
STUB_FLAGS = ("--speculative-algorithm", "NONE", "--page-size", "1", "--mamba-track-interval", "1",
              "--context-length", str(CONTEXT))


@dataclass(frozen=True)
class Target:
    """One target's two servers, the prompts to send, and each prompt's expected greedy continuation."""

    name: str
    cumulative: str  # URL of the server with SGLang's default (cumulative) streaming
    incremental: str  # URL of the server with --incremental-streaming-output
    model_path: str
    continuations: tuple[dict, ...]  # {"input_ids", "output_ids", "logprobs"}: reference.json's shape

    @property
    def prompt(self) -> list[int]:
        return list(self.continuations[0]["input_ids"])


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    """The tiny Llama, built once for the test session with SGLang's interpreter."""
    return shared_llama(sglang_python(), tmp_path_factory)


@pytest.fixture(scope="module")
def sglang_target(llama, tmp_path_factory):
    """Two real SGLang servers (cumulative, incremental) on free ports, started together, stopped at the end."""
    workdir = tmp_path_factory.mktemp("sglang-servers")
    refs = json.loads((llama / "reference.json").read_text())
    assert refs["dtype"] == "float32" and len(refs["continuations"]) == 3
    with sglang_servers(sglang_python(), llama, workdir, SGLANG_FLAGS,
                        (*SGLANG_FLAGS, "--incremental-streaming-output")) as (cumulative, incremental):
        print(f"SGLang healthy after {cumulative.startup_seconds}s and {incremental.startup_seconds}s")
        yield Target("sglang", cumulative.url, incremental.url, str(llama), tuple(refs["continuations"]))


@pytest.fixture(scope="module")
def stub_target():
    """The stub server twice (cumulative, --incremental), answering the fake's own deterministic tokens."""
    model = "stub-model"
    prompts = [[(7 * k + j) % 2048 for j in range(48)] for k in range(3)]
    conts = tuple({"input_ids": p, "output_ids": fake_tokens(p, N, False), "logprobs": [TOP1_LOGPROB] * N}
                  for p in prompts)
    flags = [*STUB_FLAGS, "--model-path", model]
    with stub_servers(flags, [*flags, "--incremental"]) as (cumulative, incremental):
        yield Target("stub", cumulative, incremental, model, conts)


@pytest.fixture(scope="module", params=["stub", "sglang"])
def target(request) -> Target:
    return request.getfixturevalue(f"{request.param}_target")


def run(coro_fn, *args):
    """Run `coro_fn(http, *args)` with a fresh aiohttp session."""
    async def main():
        async with aiohttp.ClientSession() as http:
            return await coro_fn(http, *args)
    return asyncio.run(main())


async def get(http: aiohttp.ClientSession, url: str) -> tuple[int, str, bytes]:
    async with http.get(url) as resp:
        return resp.status, resp.headers.get("Content-Type", ""), await resp.read()


async def post(http: aiohttp.ClientSession, url: str, body=None, data: bytes | None = None):
    """(status, content type, body bytes) of a POST with a JSON body (or raw `data`)."""
    kw = {"json": body} if data is None else {"data": data, "headers": {"Content-Type": "application/json"}}
    async with http.post(url, **kw) as resp:
        return resp.status, resp.headers.get("Content-Type", ""), await resp.read()


def events(raw: bytes) -> list:
    """The `data:` payloads of a server-sent-event body, JSON-decoded ("[DONE]" kept as the string)."""
    out = []
    for event in raw.decode().split("\n\n"):
        if event.strip():
            assert event.startswith("data: "), event
            body = event[len("data: "):]
            out.append(body if body == "[DONE]" else json.loads(body))
    return out


def body_of(ids: list[int], n: int = N, stream: bool = False, rid: str = "contract") -> dict:
    """The harness's own /generate body for `ids`."""
    return dict(make_backend("sglang").payload(list(ids), n, stream), rid=rid)


async def _flush_then(http, url: str, *bodies: dict) -> list[dict]:
    await make_backend("sglang").flush(http, url)
    out = []
    for body in bodies:
        status, _, raw = await post(http, f"{url}/generate", body)
        assert status == 200, raw[:500]
        out.append(json.loads(raw))
    return out


def test_health_is_an_empty_200(target):
    for url in (target.cumulative, target.incremental):
        status, _, raw = run(get, f"{url}/health")
        assert (status, raw) == (200, b"")
        assert run(lambda http, u=url: make_backend("sglang").health(http, u)) is True


def test_server_info_under_both_paths_with_what_specgate_reads(target):
    info = json.loads(run(get, f"{target.cumulative}/server_info")[2])
    older = json.loads(run(get, f"{target.cumulative}/get_server_info")[2])
    volatile = ("internal_states",)  # live scheduler state, read at each call
    assert {k: v for k, v in info.items() if k not in volatile} == {k: v for k, v in older.items() if k not in volatile}
    assert {k: info[k] for k in ("model_path", "tp_size", "page_size", "disable_radix_cache",
                                 "speculative_algorithm", "speculative_num_draft_tokens",
                                 "incremental_streaming_output", "status")} == {
        "model_path": target.model_path, "tp_size": 1, "page_size": 1, "disable_radix_cache": False,
        "speculative_algorithm": None, "speculative_num_draft_tokens": None, "incremental_streaming_output": False,
        "status": "ready"}
    assert isinstance(info["version"], str) and isinstance(info["mamba_track_interval"], int)
    inc = json.loads(run(get, f"{target.incremental}/server_info")[2])
    assert inc["incremental_streaming_output"] is True


def test_model_info(target):
    status, ctype, raw = run(get, f"{target.cumulative}/model_info")
    info = json.loads(raw)
    assert status == 200 and ctype.startswith("application/json")
    assert {k: info[k] for k in ("model_path", "served_model_name", "tokenizer_path", "is_generation")} == {
        "model_path": target.model_path, "served_model_name": target.model_path,
        "tokenizer_path": target.model_path, "is_generation": True}
    if target.name == "sglang":
        assert (info["model_type"], info["architectures"]) == ("llama", ["LlamaForCausalLM"])


@pytest.mark.parametrize("role", ["reference", "candidate"])
def test_probe_finds_top2_logprobs_cached_tokens_and_the_stream_format(target, role):
    backend = make_backend("sglang")
    for url, streaming in ((target.cumulative, "cumulative"), (target.incremental, "incremental")):
        info = run(lambda http, u=url: backend.probe(http, u, role))
        assert info["specgate_probe"] == {"backend": "sglang", "unknown": [], "notes": [], "role": role,
                                          "settings_path": "/server_info", "streaming": streaming,
                                          "block_size": None, "logprobs": f"top-{TOP_K}"}


def test_generate_answer_format(target):
    """One non-streamed answer on the wire: SGLang's keys, logprob entries `[logprob, token_id, null]`, top-2
    entries best first with the chosen token first, finish_reason `{"type": "length", "length": N}`."""
    ref = target.continuations[0]
    (ans,) = run(_flush_then, target.cumulative, body_of(ref["input_ids"], rid="wire-1"))
    assert set(ans) == {"text", "output_ids", "meta_info"}
    meta = ans["meta_info"]
    assert ans["output_ids"] == ref["output_ids"] and isinstance(ans["text"], str) and ans["text"]
    assert {k: meta[k] for k in ("id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens",
                                 "cached_tokens_details", "output_token_logprobs_length", "input_token_logprobs",
                                 "input_top_logprobs")} == {
        "id": "wire-1", "finish_reason": {"type": "length", "length": N}, "prompt_tokens": len(ref["input_ids"]),
        "completion_tokens": N, "cached_tokens": 0, "cached_tokens_details": None,
        "output_token_logprobs_length": N, "input_token_logprobs": [], "input_top_logprobs": []}
    assert isinstance(meta["e2e_latency"], float)
    chosen, top = meta["output_token_logprobs"], meta["output_top_logprobs"]
    assert [e[1:] for e in chosen] == [[t, None] for t in ref["output_ids"]]
    assert len(top) == N and all(len(t) == TOP_K and [len(e) for e in t] == [3, 3] for t in top)
    assert all(t[0] == c and t[1][2] is None and t[0][0] >= t[1][0] for t, c in zip(top, chosen, strict=True))


def test_backend_generate_matches_the_wire_and_the_oracle(target):
    backend = make_backend("sglang")
    for ref in target.continuations:
        (raw,) = run(_flush_then, target.cumulative, body_of(ref["input_ids"], rid="oracle-raw"))
        gen = run(lambda http, r=ref: _flush_and_generate(http, target.cumulative, backend, r["input_ids"], False))
        meta = raw["meta_info"]
        assert gen.output_ids == raw["output_ids"] == ref["output_ids"]
        assert gen.output_text == raw["text"]
        assert gen.output_logprobs == [e[0] for e in meta["output_token_logprobs"]]
        assert gen.output_top_logprobs == [[[e[0], e[1]] for e in t] for t in meta["output_top_logprobs"]]
        assert (gen.finish_reason, gen.completion_tokens, gen.cached_tokens) == ("length", N, 0)
        assert (gen.spec_verify_ct, gen.spec_accept_length, gen.spec_trace, gen.abort_message) == (None,) * 4
        # fp32 SGLang and fp32 transformers agree to float noise (the stub's log-prob is its constant)
        assert max(abs(a - b) for a, b in zip(gen.output_logprobs, ref["logprobs"], strict=True)) < 1e-4
        margins = [t[0][0] - t[1][0] for t in gen.output_top_logprobs]
        if target.name == "stub":
            assert margins == [pytest.approx(TOP2_GAP)] * N


async def _flush_and_generate(http, url, backend, ids, stream, incremental=False):
    await backend.flush(http, url)
    return await backend.generate(http, url, dict(backend.payload(list(ids), N, stream), rid="gen"), 300,
                                  incremental=incremental)


def test_cumulative_stream_format(target):
    """Default streaming: every chunk holds everything so far (ids, text, logprobs); the last has finish_reason
    and e2e_latency; then `data: [DONE]`. The backend reads it to the non-streamed answer, with a TTFT."""
    ref = target.continuations[0]
    backend = make_backend("sglang")

    async def go(http):
        await backend.flush(http, target.cumulative)
        status, ctype, raw = await post(http, f"{target.cumulative}/generate", body_of(ref["input_ids"], stream=True))
        gen = await _flush_and_generate(http, target.cumulative, backend, ref["input_ids"], True)
        return status, ctype, events(raw), gen

    status, ctype, chunks, gen = run(go)
    assert status == 200 and ctype.startswith("text/event-stream") and chunks[-1] == "[DONE]"
    chunks = chunks[:-1]
    assert chunks and all(set(c) == {"text", "output_ids", "meta_info"} for c in chunks)
    for prev, cur in itertools.pairwise(chunks):
        assert cur["output_ids"][:len(prev["output_ids"])] == prev["output_ids"]
        assert cur["text"].startswith(prev["text"])
    for c in chunks:
        meta, n = c["meta_info"], len(c["output_ids"])
        assert len(meta["output_token_logprobs"]) == len(meta["output_top_logprobs"]) == n
        assert meta["completion_tokens"] == meta["output_token_logprobs_length"] == n
        assert (meta["finish_reason"] is None) == (c is not chunks[-1]) == ("e2e_latency" not in meta)
    assert chunks[-1]["output_ids"] == ref["output_ids"]
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": N}
    assert gen.output_ids == ref["output_ids"] and gen.ttft is not None and gen.ttft > 0
    assert (gen.finish_reason, gen.completion_tokens, gen.cached_tokens) == ("length", N, 0)


def test_incremental_stream_format(target):
    """--incremental-streaming-output: each chunk holds only what is new (ids, text, logprobs), while
    completion_tokens and output_token_logprobs_length count everything so far. The backend puts the chunks
    together to the non-streamed answer."""
    ref = target.continuations[0]
    backend = make_backend("sglang")

    async def go(http):
        await backend.flush(http, target.incremental)
        _, _, raw = await post(http, f"{target.incremental}/generate", body_of(ref["input_ids"], stream=True))
        plain = await _flush_and_generate(http, target.incremental, backend, ref["input_ids"], False)
        gen = await _flush_and_generate(http, target.incremental, backend, ref["input_ids"], True, incremental=True)
        return events(raw), plain, gen

    chunks, plain, gen = run(go)
    assert chunks[-1] == "[DONE]"
    chunks, total = chunks[:-1], 0
    for c in chunks:
        meta, n = c["meta_info"], len(c["output_ids"])
        total += n
        assert n >= 1 and len(meta["output_token_logprobs"]) == len(meta["output_top_logprobs"]) == n
        assert meta["completion_tokens"] == meta["output_token_logprobs_length"] == total
    assert [t for c in chunks for t in c["output_ids"]] == ref["output_ids"]
    assert "".join(c["text"] for c in chunks) == plain.output_text
    assert [e[0] for c in chunks for e in c["meta_info"]["output_token_logprobs"]] == plain.output_logprobs
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": N}
    assert (gen.output_ids, gen.output_logprobs, gen.output_top_logprobs, gen.output_text) == (
        plain.output_ids, plain.output_logprobs, plain.output_top_logprobs, plain.output_text)


def test_radix_hits_count_the_cached_prefix_and_flush_empties_it(target):
    """cached_tokens: 0 cold; the prompt but its last token on a repeat; the prompt and all output tokens but
    the last (whose KV is never computed) for a next turn; 0 again after /flush_cache."""
    p = target.prompt
    backend = make_backend("sglang")

    async def go(http):
        first, again = await _flush_then(http, target.cumulative, body_of(p, rid="r1"), body_of(p, rid="r2"))
        turn = p + first["output_ids"] + [5, 6, 7]
        _, _, raw = await post(http, f"{target.cumulative}/generate", body_of(turn, rid="r3"))
        status, _, flushed = await post(http, f"{target.cumulative}/flush_cache")
        _, _, cold = await post(http, f"{target.cumulative}/generate", body_of(p, rid="r4"))
        gen = await backend.generate(http, target.cumulative, body_of(turn, rid="r5"), 300)
        return first, again, json.loads(raw), (status, flushed), json.loads(cold), gen

    first, again, turn, flushed, cold, gen = run(go)
    assert [a["meta_info"]["cached_tokens"] for a in (first, again, turn, cold)] == [0, len(p) - 1, len(p) + N - 1, 0]
    assert again["meta_info"]["cached_tokens_details"] == {"device": len(p) - 1, "host": 0}
    assert again["output_ids"] == first["output_ids"] == cold["output_ids"]
    assert flushed[0] == 200 and flushed[1].startswith(b"Cache flushed.")
    assert gen.cached_tokens == len(p) + N - 1  # the backend's record of the hit r4 put back


def test_flush_cache_through_the_backend(target):
    backend = make_backend("sglang")
    for url in (target.cumulative, target.incremental):
        assert run(lambda http, u=url: backend.flush(http, u)) is None
        status, _, raw = run(get, f"{url}/flush_cache")  # SGLang takes GET too
        assert status == 200 and raw.startswith(b"Cache flushed.\nPlease check backend logs")


def test_error_bodies(target):
    """A body the request schema rejects: FastAPI's OpenAI-shaped error; a request SGLang refuses:
    `{"error": {"message"}}`; the same refusal streamed: HTTP 200, an in-band error chunk, [DONE]."""
    url = f"{target.cumulative}/generate"
    p = target.prompt
    long = (f"Requested token count exceeds the model's maximum context length of {CONTEXT} tokens. You requested a "
            f"total of {len(p) + 100000} tokens: {len(p)} tokens from the input messages and 100000 tokens for the "
            "completion. Please reduce the number of tokens in the input messages or the completion to fit within "
            "the limit.")

    async def go(http):
        return [await post(http, url, {"input_ids": "abc"}), await post(http, url, data=b"{not json"),
                await post(http, url, {"input_ids": [], "sampling_params": {"max_new_tokens": 2}}),
                await post(http, url, body_of(p, 100000)), await post(http, url, body_of(p, 100000, stream=True))]

    schema, not_json, empty, too_long, streamed = run(go)
    for status, ctype, raw in (schema, not_json):
        err = json.loads(raw)
        assert status == 400 and ctype.startswith("application/json")
        assert {k: err[k] for k in ("object", "type", "param", "code")} == {
            "object": "error", "type": "Bad Request", "param": None, "code": 400}
        assert err["message"].startswith("1 validation error:\n")
    assert "'loc': ('body', 'input_ids'), 'msg': 'Value error, must be list or null; got str'" in \
        json.loads(schema[2])["message"]
    assert "'type': 'json_invalid'" in json.loads(not_json[2])["message"]
    assert (empty[0], json.loads(empty[2])) == (400, {"error": {"message": "input_ids cannot be empty."}})
    assert (too_long[0], json.loads(too_long[2])) == (400, {"error": {"message": long}})
    assert streamed[0] == 200 and events(streamed[2]) == [
        {"error": {"message": long, "type": "invalid_request_error", "code": 400, "retryable": False}}, "[DONE]"]


@pytest.mark.parametrize("stream", [False, True])
def test_backend_turns_refusals_into_request_errors(target, stream):
    """A refused request is the request's own failure (RequestError), not the replica's, streamed or not."""
    backend = make_backend("sglang")
    body = body_of(target.prompt, 100000, stream=stream)
    with pytest.raises(RequestError) as err:
        run(lambda http: backend.generate(http, target.cumulative, body, 120))
    prefix = "server error 400: " if stream else 'HTTP 400: {"error":{"message":"'
    assert str(err.value).startswith(prefix + "Requested token count exceeds the model's maximum context length")


def test_real_server_runs_what_it_was_started_with(sglang_target):
    """What a gate reads back to check a server: the version, the flags it was launched with, the radix cache on
    and, for a Llama, no mamba radix cache in use (the strategy stays unresolved at `auto`)."""
    info = json.loads(run(get, f"{sglang_target.cumulative}/server_info")[2])
    assert info["version"] == "0.5.23" and info["frontend"] == "python"
    assert info["launch_command"].split()[-2:] == ["--dtype", "float32"]
    assert (info["dtype"], info["device"], info["attention_backend"]) == ("float32", "cpu", "torch_native")
    assert (info["uses_mamba_radix_cache"], info["mamba_radix_cache_strategy"]) == (False, "auto")
    assert info["mamba_track_interval"] == 256 and info["max_running_requests"] is None
    assert isinstance(info["internal_states"], list) and len(info["internal_states"]) == 1


def test_recorded_payloads_hold_the_real_keys(sglang_target):
    """The recorded /server_info payloads the stub tests replay use key names a real SGLang has (all but the
    pre-rename alias `mamba_scheduler_strategy`), and `cpu_llama` is what this one reports."""
    for url, incremental in ((sglang_target.cumulative, False), (sglang_target.incremental, True)):
        info = json.loads(run(get, f"{url}/server_info")[2])
        recorded = server_infos.cpu_llama(sglang_target.model_path, incremental)
        assert {k: info[k] for k in recorded} == recorded
    keys = (set(server_infos.current(16, 4)) | set(server_infos.older(16, 4))) - {"mamba_scheduler_strategy"}
    assert sorted(keys - set(info)) == []
