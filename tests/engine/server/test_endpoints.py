"""Round trips of every endpoint against a real server subprocess (DFlash, interval 64, page 16)."""

from __future__ import annotations

import json
import math
import threading
import urllib.request

import pytest

from protocol.tokenizer import BYTE_TOKENIZER, BYTE_TOKENIZER_DIR
from tests.engine.server.client import API_KEY, open_stream

pytestmark = pytest.mark.slow

PROMPT = "The quick brown fox"  # short: prompt + output stay under the 64-token interval, so no cache hits


def check_logprob_entry(e) -> None:
    assert isinstance(e, list) and len(e) == 3
    assert isinstance(e[0], float) and e[0] <= 0 and math.isfinite(e[0])
    assert isinstance(e[1], int) and 0 <= e[1] < 260
    assert e[2] is None


def test_generate_shape_and_logprobs(server):
    ans = server.generate(text=PROMPT, sampling_params={"max_new_tokens": 6, "temperature": 0, "ignore_eos": True},
                          rid="shape-1", return_logprob=True, top_logprobs_num=3)
    assert set(ans) == {"text", "output_ids", "meta_info"}
    meta = ans["meta_info"]
    assert meta["id"] == "shape-1"
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["prompt_tokens"] == len(PROMPT) and meta["completion_tokens"] == 6
    assert meta["cached_tokens"] == 0 and meta["e2e_latency"] > 0
    assert len(ans["output_ids"]) == 6 and ans["text"] == BYTE_TOKENIZER.decode(ans["output_ids"])
    lps, tops = meta["output_token_logprobs"], meta["output_top_logprobs"]
    assert len(lps) == len(tops) == 6
    for tok, lp, top in zip(ans["output_ids"], lps, tops, strict=True):
        check_logprob_entry(lp)
        assert lp[1] == tok
        assert len(top) == 3
        for e in top:
            check_logprob_entry(e)
        assert [e[0] for e in top] == sorted((e[0] for e in top), reverse=True)
        assert top[0][1] == tok and top[0][0] == pytest.approx(lp[0])  # greedy picks the top-1
    # speculative fields: one trace entry per verify step, each starting where the last one ended
    trace = meta["spec_trace"]
    assert meta["spec_verify_ct"] == len(trace) > 0
    assert meta["spec_accept_length"] == pytest.approx(6 / len(trace))
    assert trace[0][0] == len(PROMPT)
    for (pre, commit, tracked), nxt in zip(trace, trace[1:], strict=False):
        assert commit >= 1 and -1 <= tracked < commit and nxt[0] == pre + commit


def test_logprob_fields_only_when_asked(server):
    meta = server.generate(input_ids=[72, 105], sampling_params={"max_new_tokens": 2})["meta_info"]
    assert "output_token_logprobs" not in meta and "output_top_logprobs" not in meta
    meta = server.generate(input_ids=[72, 105], sampling_params={"max_new_tokens": 2}, return_logprob=True,
                           return_text_in_logprobs=True)["meta_info"]
    assert all(isinstance(e[2], str) for e in meta["output_token_logprobs"])
    assert meta["output_top_logprobs"] == [[], []]


def assemble(chunks: list[dict]) -> dict:
    """The answer a client rebuilds from incremental chunks: lists and text concatenated, meta from the last."""
    ans = {"text": "", "output_ids": [], "meta_info": dict(chunks[-1]["meta_info"])}
    lists = {"output_token_logprobs": [], "output_top_logprobs": [], "spec_trace": []}
    for c in chunks:
        ans["text"] += c["text"]
        ans["output_ids"] += c["output_ids"]
        for key, acc in lists.items():
            acc += c["meta_info"].get(key, [])
    ans["meta_info"].update(lists)
    return ans


def stream(server, body: dict) -> list[dict]:
    r = server.call("POST", "/generate", dict(body, stream=True))
    assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    events = r.events()
    assert events[-1] == "[DONE]"
    return events[:-1]


def test_stream_is_incremental_and_assembles_to_the_plain_answer(server):
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 12, "ignore_eos": True, "temperature": 0},
            "return_logprob": True, "top_logprobs_num": 2}
    plain = server.generate(**body)
    assert server.call("GET", "/server_info").json()["incremental_streaming_output"] is True
    chunks = stream(server, body)
    assert len(chunks) >= 2
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    sent = 0
    for c in chunks:  # each chunk: only the new ids and their logprobs; counters cumulative
        sent += len(c["output_ids"])
        assert c["meta_info"]["completion_tokens"] == sent
        assert len(c["meta_info"]["output_token_logprobs"]) == len(c["output_ids"])
        assert len(c["meta_info"]["output_top_logprobs"]) == len(c["output_ids"])
    whole = assemble(chunks)
    for key in ("text", "output_ids"):
        assert whole[key] == plain[key]
    for key in ("finish_reason", "output_token_logprobs", "output_top_logprobs", "spec_trace", "completion_tokens",
                "spec_verify_ct"):
        assert whole["meta_info"][key] == plain["meta_info"][key], key


def test_streamed_text_with_a_stop_string_assembles_to_the_trimmed_text(server):
    sp = {"max_new_tokens": 10, "ignore_eos": True, "temperature": 0}
    text = server.generate(text=PROMPT, sampling_params=sp)["text"]
    stop = next((text[i:i + 2] for i in range(3, len(text) - 1) if "\ufffd" not in text[i:i + 2]), None)
    if stop is None:
        pytest.skip("no decodable pair of characters to stop on")
    body = {"text": PROMPT, "sampling_params": dict(sp, stop=stop)}
    plain = server.generate(**body)
    assert plain["meta_info"]["finish_reason"]["type"] == "stop"
    assert assemble(stream(server, body))["text"] == plain["text"]


def test_streamed_size_is_linear_in_tokens(server):
    """The issue's case: top_logprobs_num 260 made a 400-token stream 789 MB. Now bytes grow with tokens."""
    def streamed_bytes(n: int) -> int:
        body = {"input_ids": [40, 41, 42], "stream": True, "return_logprob": True, "top_logprobs_num": 260,
                "sampling_params": {"max_new_tokens": n, "ignore_eos": True, "temperature": 0}}
        r = server.call("POST", "/generate", body)
        assert r.status == 200
        assert sum(len(e["output_ids"]) for e in r.events()[:-1]) == n
        return len(r.body)

    small, large = streamed_bytes(100), streamed_bytes(400)
    print(f"streamed bytes: 100 tokens {small}, 400 tokens {large}, ratio {large / small:.2f} "
          "(linear 4, quadratic ~16)")
    assert 3.0 < large / small < 4.5


def test_stop_string_trims_text(server):
    sp = {"max_new_tokens": 8, "ignore_eos": True, "temperature": 0}
    first = server.generate(text=PROMPT, sampling_params=sp)
    text = first["text"]
    stop = next((ch for ch in text[2:] if ch != "\ufffd"), None)
    if stop is None:
        pytest.skip("no decodable character to stop on")
    ans = server.generate(text=PROMPT, sampling_params=dict(sp, stop=stop))
    assert ans["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert stop not in ans["text"] and text.startswith(ans["text"])


def test_session_second_turn_hits_cache_and_flush_resets_it(server):
    server.flush()
    turn1_ids = [(7 * i) % 200 + 32 for i in range(150)]
    t1 = server.generate(input_ids=turn1_ids, sampling_params={"max_new_tokens": 20, "ignore_eos": True})
    assert t1["meta_info"]["cached_tokens"] == 0
    turn2_ids = turn1_ids + t1["output_ids"] + [65, 66, 67, 68, 69]
    body = {"input_ids": turn2_ids, "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}
    assert server.generate(**body)["meta_info"]["cached_tokens"] == 128  # last 64-boundary of turn 1's 170 tokens
    server.flush()
    assert server.generate(**body)["meta_info"]["cached_tokens"] == 0
    m = server.metrics()
    assert m["specgate_cached_tokens_total"] >= 128


def test_prompt_log_probs_from_logprob_start_len_match_no_deeper(server):
    """SGLang's input_token_logprobs: one [logprob, id, text] per prompt token from logprob_start_len (null for the
    first), the match capped at the start; streamed, once, with the first tokens."""
    server.flush()
    turn1_ids = [(7 * i) % 200 + 32 for i in range(150)]
    t1 = server.generate(input_ids=turn1_ids, sampling_params={"max_new_tokens": 20, "ignore_eos": True})
    ids = turn1_ids + t1["output_ids"] + [65, 66, 67, 68, 69]
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 3, "ignore_eos": True, "temperature": 0},
            "return_logprob": True, "logprob_start_len": 128, "top_logprobs_num": 2, "return_text_in_logprobs": True}
    ans = server.generate(**body)
    meta = ans["meta_info"]
    assert meta["cached_tokens"] == 128
    entries, tops = meta["input_token_logprobs"], meta["input_top_logprobs"]
    assert [e[1] for e in entries] == ids[128:]
    assert [e[2] for e in entries] == [chr(t) if t < 128 else f"bytes:\\x{t:02x}" for t in ids[128:]]
    assert entries[0][0] is None and tops[0] is None
    assert all(isinstance(e[0], float) and e[0] <= 0 for e in entries[1:])
    assert all(len(t) == 2 and t[0][0] >= t[1][0] for t in tops[1:])
    below = server.generate(**dict(body, logprob_start_len=100))["meta_info"]
    assert below["cached_tokens"] == 0 and below["input_token_logprobs"][0][0] is None  # no checkpoint <= 100
    cold = [e[0] for e in below["input_token_logprobs"][29:]]  # the same tokens, prefilled from the start
    assert cold == pytest.approx([e[0] for e in entries[1:]], abs=1e-4)
    chunks = stream(server, body)
    with_prompt = [c for c in chunks if "input_token_logprobs" in c["meta_info"]]
    assert len(with_prompt) == 1 and with_prompt[0]["output_ids"]
    assert with_prompt[0]["meta_info"]["input_token_logprobs"] == entries
    plain = server.generate(**{k: v for k, v in body.items() if k != "logprob_start_len"})["meta_info"]
    assert "input_token_logprobs" not in plain and plain["cached_tokens"] == 128


def test_flush_and_duplicate_rid_refused_while_running(server):
    server.wait_idle()
    conn, _resp, first = open_stream(server, "/generate", {
        "input_ids": [1, 2, 3], "rid": "busy-1", "stream": True,
        "sampling_params": {"max_new_tokens": 1500, "ignore_eos": True}})
    try:
        assert first["meta_info"]["id"] == "busy-1"
        r = server.call("POST", "/flush_cache")
        assert r.status == 400 and "flush_cache" in r.json()["error"]["message"]
        r = server.call("POST", "/generate", {"input_ids": [1], "rid": "busy-1"})
        assert r.status == 400 and "rid" in r.json()["error"]["message"]
    finally:
        conn.close()
    server.wait_idle()
    server.flush()


def test_health_info_metrics(server):
    r = server.call("GET", "/health", auth=False)
    assert r.status == 200 and r.json() == {"status": "ok"}
    info = server.call("GET", "/server_info").json()
    for key, want in [("mamba_track_interval", 64), ("mamba_radix_cache_strategy", "extra_buffer"),
                      ("speculative_algorithm", "DFLASH"), ("speculative_num_draft_tokens", 8), ("tp_size", 1),
                      ("inject_fault", None), ("page_size", 16), ("block_size", 8)]:
        assert info[key] == want, key
    assert isinstance(info["avg_accept_length"], float) and "api_key" not in info
    model = server.call("GET", "/model_info").json()
    assert model["model_path"] == "random" and model["is_generation"] is True
    assert model["vocab_size"] == 260 and model["max_context_length"] == 2048
    r = server.call("GET", "/metrics")
    assert r.headers["Content-Type"].startswith("text/plain")
    text = r.body.decode()
    for name in ("specgate_requests_total", "specgate_prompt_tokens_total", "specgate_generation_tokens_total",
                 "specgate_cached_tokens_total", "specgate_spec_verify_steps_total", "specgate_spec_accept_length",
                 "specgate_num_running_reqs", "specgate_num_queue_reqs", "specgate_kv_pages_used",
                 "specgate_state_slots_used", "specgate_token_usage"):
        assert f"# HELP {name} " in text and f"# TYPE {name} " in text, name
    assert server.metrics()["specgate_requests_total"] >= 1


def _openai_post(server, body: dict):
    req = urllib.request.Request(f"{server.url}/v1/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})
    return urllib.request.urlopen(req, timeout=60)


def test_openai_completion_with_plain_urllib(server):
    body = {"model": "random-tiny", "prompt": "Say hello", "max_tokens": 5, "temperature": 0, "logprobs": 2,
            "top_p": 1, "n": 1, "stream": False, "stop": None, "user": "load-tool"}
    with _openai_post(server, body) as resp:
        assert resp.status == 200
        ans = json.loads(resp.read())
    assert ans["object"] == "text_completion" and ans["id"].startswith("cmpl-")
    assert isinstance(ans["created"], int) and ans["model"] == "random-tiny"
    (choice,) = ans["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] == "length" and isinstance(choice["text"], str)
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == 5
    assert all(len(t) >= 1 and tok in t for t, tok in zip(lp["top_logprobs"], lp["tokens"], strict=True))
    assert ans["usage"] == {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14,
                            "prompt_tokens_details": {"cached_tokens": 0}}
    # streamed: deltas concatenate to the same text, then usage, then [DONE]
    body.update(stream=True, stream_options={"include_usage": True}, logprobs=None)
    with _openai_post(server, body) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        lines = [ln.decode().strip() for ln in resp if ln.strip()]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[len("data: "):]) for ln in lines[:-1]]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
    text = "".join(c["choices"][0]["text"] for c in chunks[:-1])
    assert text == choice["text"] and chunks[-2]["choices"][0]["finish_reason"] == "length"
    # token-list prompt, no model named
    with _openai_post(server, {"prompt": [83, 97, 121], "max_tokens": 2}) as resp:
        ans = json.loads(resp.read())
        assert ans["usage"]["prompt_tokens"] == 3 and ans["model"] == str(BYTE_TOKENIZER_DIR)


def test_api_key(server):
    r = server.call("POST", "/generate", {"text": "a"}, auth=False)
    assert r.status == 401 and "Authorization" in r.json()["error"]["message"]
    r = server.call("GET", "/server_info", auth=False, headers={"Authorization": "Bearer nope"})
    assert r.status == 401 and "wrong API key" in r.json()["error"]["message"]
    assert server.call("GET", "/health", auth=False).status == 200


def test_concurrent_requests(server):
    results = {}

    def one(i):
        results[i] = server.generate(input_ids=[40 + i, 41, 42], rid=f"conc-{i}",
                                     sampling_params={"max_new_tokens": 5, "ignore_eos": True})

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == [0, 1, 2, 3]
    assert all(r["meta_info"]["completion_tokens"] == 5 for r in results.values())


def test_seeded_sampling_is_reproducible(server):
    body = {"input_ids": [10, 20, 30], "sampling_params": {"max_new_tokens": 6, "temperature": 0.8, "seed": 7,
                                                           "ignore_eos": True}}
    a, b = server.generate(**body), server.generate(**body)
    assert a["output_ids"] == b["output_ids"]
    # a temperature below 1e-6 is greedy (as in SGLang) instead of overflowing logits / T
    tiny = server.generate(input_ids=[10, 20, 30], sampling_params={"max_new_tokens": 3, "temperature": 1e-300})
    greedy = server.generate(input_ids=[10, 20, 30], sampling_params={"max_new_tokens": 3, "temperature": 0})
    assert tiny["output_ids"] == greedy["output_ids"]
