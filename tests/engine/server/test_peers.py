"""The peers' dialects on a live server: replayed bodies of four load tools, and the official openai client."""

from __future__ import annotations

import pytest
from openai import BadRequestError, OpenAI

from engine.server.chat import render_chat
from protocol.byte_export import BYTE_CHAT_TEMPLATE
from protocol.hf_tokenizer import load_tokenizer
from protocol.tokenizer import BYTE_TOKENIZER, BYTE_TOKENIZER_DIR
from tests.engine.server.client import API_KEY
from tests.engine.server.peer_bodies import bodies

MODEL = str(BYTE_TOKENIZER_DIR)  # the served id of random weights: where their tokenizer files are
PROMPT = "def fibonacci(n):\n    "
N = 6


def stream_events(reply) -> list[dict]:
    events = reply.events()
    assert events[-1] == "[DONE]"
    return events[:-1]


@pytest.mark.parametrize("name,path,body,headers", bodies(MODEL, PROMPT, N), ids=[b[0] for b in bodies(MODEL, "", 1)])
def test_peer_bodies_are_served(server, name, path, body, headers):
    r = server.call("POST", path, body, headers=headers)
    assert r.status == 200, r.body
    exact = body.get("ignore_eos") or body.get("sampling_params", {}).get("ignore_eos")
    if path == "/generate":
        (*_, last) = stream_events(r)
        assert last["meta_info"]["completion_tokens"] == N and last["meta_info"]["finish_reason"]["type"] == "length"
        return
    if not body["stream"]:
        ans = r.json()
        assert ans["usage"]["completion_tokens"] == N and ans["choices"][0]["finish_reason"] == "length"
        return
    events = stream_events(r)
    chat = path.endswith("chat/completions")
    content = [e for e in events if e["choices"]]
    text = "".join((c["choices"][0]["delta"].get("content") or "") if chat else c["choices"][0]["text"]
                   for c in content)
    assert content[-1]["choices"][0]["finish_reason"] in ("length", "stop")
    opts = body.get("stream_options") or {}
    if opts.get("include_usage"):
        assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] <= N
        if exact:
            assert events[-1]["usage"]["completion_tokens"] == N
    else:
        assert all("usage" not in e for e in events)
    if opts.get("continuous_usage_stats"):  # GuideLLM: usage so far on every chunk
        counts = [e["usage"]["completion_tokens"] for e in content]
        assert counts == sorted(counts) and counts[-1] == N and all(e["usage"]["prompt_tokens"] > 0 for e in content)
    # the same request non-streamed gives the same text (greedy where the tool asks for temperature 0)
    if body.get("temperature") == 0.0:
        plain = dict(body, stream=False)
        plain.pop("stream_options", None)
        ans = server.call("POST", path, plain).json()
        choice = ans["choices"][0]
        assert (choice["message"]["content"] if chat else choice["text"]) == text


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=60)


def test_openai_client_models_and_completions(client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    ids = BYTE_TOKENIZER.encode("import os\nimport sys\n")
    c = client.completions.create(model=MODEL, prompt=ids, max_tokens=N, temperature=0, logprobs=2,
                                  extra_body={"return_token_ids": True, "ignore_eos": True})
    choice = c.choices[0]
    assert choice.prompt_token_ids == ids and len(choice.token_ids) == N
    assert c.usage.completion_tokens == N and c.usage.prompt_tokens_details.cached_tokens >= 0
    assert choice.logprobs.tokens == [BYTE_TOKENIZER.decode([t], keep_special=True) if t < 128 or t >= 256
                                      else f"bytes:\\x{t:02x}" for t in choice.token_ids]
    # vLLM's return_tokens_as_token_ids: every logprob token names its id
    d = client.completions.create(model=MODEL, prompt=ids, max_tokens=N, temperature=0, logprobs=2,
                                  extra_body={"return_tokens_as_token_ids": True, "ignore_eos": True})
    assert d.choices[0].logprobs.tokens == [f"token_id:{t}" for t in choice.token_ids]
    assert all(f"token_id:{t}" in top for t, top in zip(choice.token_ids, d.choices[0].logprobs.top_logprobs,
                                                         strict=True))


def test_openai_client_streams_with_continuous_usage(client):
    ids = BYTE_TOKENIZER.encode("class Queue:\n")
    stream = client.completions.create(
        model=MODEL, prompt=ids, max_tokens=N, temperature=0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        extra_body={"return_token_ids": True, "ignore_eos": True})
    chunks = list(stream)
    content, final = chunks[:-1], chunks[-1]
    assert final.choices == [] and final.usage.completion_tokens == N
    assert content[0].choices[0].prompt_token_ids == ids
    assert all(getattr(c.choices[0], "prompt_token_ids", None) is None for c in content[1:])
    streamed = [t for c in content for t in c.choices[0].token_ids]
    assert len(streamed) == N and [c.usage.completion_tokens for c in content][-1] == N
    plain = client.completions.create(model=MODEL, prompt=ids, max_tokens=N, temperature=0,
                                      extra_body={"return_token_ids": True, "ignore_eos": True})
    assert streamed == plain.choices[0].token_ids
    assert "".join(c.choices[0].text for c in content) == plain.choices[0].text


def test_openai_client_chat(client):
    messages = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "A loop:"}]
    rendered = render_chat([(m["role"], m["content"]) for m in messages])
    assert rendered == "system: You write Python.\nuser: A loop:\nassistant: "
    r = client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=N, temperature=0,
                                       logprobs=True, top_logprobs=2,
                                       extra_body={"return_token_ids": True, "ignore_eos": True})
    assert r.object == "chat.completion" and r.prompt_token_ids == BYTE_TOKENIZER.encode(rendered)
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason == "length"
    assert choice.message.content == BYTE_TOKENIZER.decode(choice.token_ids)
    assert len(choice.logprobs.content) == N and all(len(e.top_logprobs) == 2 for e in choice.logprobs.content)
    # the chat endpoint is the completions endpoint over the rendered template
    c = client.completions.create(model=MODEL, prompt=rendered, max_tokens=N, temperature=0,
                                  extra_body={"return_token_ids": True, "ignore_eos": True})
    assert c.choices[0].token_ids == choice.token_ids
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=N, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].usage.completion_tokens == N
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == choice.message.content


def test_openai_client_chat_refusals_name_the_field(client):
    with pytest.raises(BadRequestError, match=r"messages\[0\]\.content\[0\]\.type: this engine is text-only"):
        client.chat.completions.create(model=MODEL, max_completion_tokens=2, messages=[
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}])
    with pytest.raises(BadRequestError, match=r"continue_final_message: cannot be true while add_generation_prompt"):
        client.chat.completions.create(model=MODEL, max_completion_tokens=2, messages=[
            {"role": "assistant", "content": "x"}], extra_body={"continue_final_message": True})
    with pytest.raises(BadRequestError, match=r"n: this server answers one choice per request: send n requests"):
        client.chat.completions.create(model=MODEL, max_completion_tokens=2, n=2,
                                       messages=[{"role": "user", "content": "x"}])
    with pytest.raises(BadRequestError, match=r"min_tokens: must be <= 2, got 3"):
        client.completions.create(model=MODEL, prompt="x", max_tokens=2, extra_body={"min_tokens": 3})


def test_continue_final_message_leaves_the_turn_open(client):
    r = client.chat.completions.create(
        model=MODEL, max_completion_tokens=2, temperature=0,
        messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hel"}],
        extra_body={"continue_final_message": True, "add_generation_prompt": False, "return_token_ids": True})
    assert r.prompt_token_ids == BYTE_TOKENIZER.encode("user: hi\nassistant: hel")


def test_min_tokens_keeps_stop_tokens_out(client):
    ids = BYTE_TOKENIZER.encode("for i in range(10):\n")
    free = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0,
                                     extra_body={"return_token_ids": True, "ignore_eos": True}).choices[0].token_ids
    stop_at = free[1]
    first = free.index(stop_at)  # the first output position carrying that token
    stopped = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0,
                                        extra_body={"return_token_ids": True, "ignore_eos": True,
                                                    "stop_token_ids": [stop_at]}).choices[0]
    assert stopped.finish_reason == "stop" and stopped.token_ids == free[:first + 1]
    held = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0,
                                     extra_body={"return_token_ids": True, "ignore_eos": True,
                                                 "stop_token_ids": [stop_at], "min_tokens": 8}).choices[0]
    # as SGLang and vLLM: before min_tokens the stop tokens are not sampled, the next best token is
    assert held.finish_reason == "length" and len(held.token_ids) == 8 and stop_at not in held.token_ids
    assert held.token_ids[:first] == free[:first] and held.token_ids[first] != stop_at


def test_server_info_names_the_exported_tokenizer(server):
    for path in ("/server_info", "/get_server_info", "/model_info"):
        info = server.call("GET", path).json()
        assert info["tokenizer"] == "byte" and info["tokenizer_path"] == str(BYTE_TOKENIZER_DIR), path
    tok = load_tokenizer(server.call("GET", "/server_info").json()["tokenizer_path"])
    assert tok.name == "byte" and tok.vocab_size == 260


def test_jinja_chat_template_renders_like_the_server():
    import jinja2  # installed with torch

    template = jinja2.Environment().from_string(BYTE_CHAT_TEMPLATE)
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "two\nlines"},
                {"role": "assistant", "content": ""}]
    for gen in (True, False):
        assert template.render(messages=messages, add_generation_prompt=gen) == \
            render_chat([(m["role"], m["content"]) for m in messages], gen)
