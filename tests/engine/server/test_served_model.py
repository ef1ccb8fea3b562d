"""What peer tools find: the model id is the directory holding tokenizer.json and tokenizer_config.json, unknown
model names are a 404 naming the served one, vLLM's cache-reset path, and speculation metrics under vLLM's and
SGLang's names."""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiohttp.test_utils import TestClient, TestServer

from engine.config import EngineConfig
from engine.runner import DEFAULT_WEIGHTS
from engine.server.app import make_app
from engine.server.async_engine import AsyncEngine
from engine.server.metrics import label_value
from engine.server.served_model import served_model
from engine.server.validate import ApiError
from protocol import byte_export
from protocol.hf_tokenizer import load_tokenizer
from protocol.tokenizer import BYTE_TOKENIZER_DIR
from tests.engine.server.client import open_stream

BYTE_DIR = str(BYTE_TOKENIZER_DIR)
TINY = EngineConfig(model_path="random", model_preset="tiny")


# --- the identity, without a server -------------------------------------------------------------
def test_random_weights_are_served_as_the_byte_tokenizer_directory():
    m = served_model(TINY)
    assert (m.name, m.root, m.tokenizer_dir, m.aliases) == (BYTE_DIR, BYTE_DIR, BYTE_DIR, ("random", "random-tiny"))


def test_the_default_weights_are_served_as_their_directory_which_ships_the_tokenizer():
    assert (DEFAULT_WEIGHTS / "model.safetensors").exists()  # the committed trained model
    m = served_model(EngineConfig())
    assert (m.name, m.root, m.tokenizer_dir, m.aliases) == (str(DEFAULT_WEIGHTS),) * 3 + (("default",),)
    assert DEFAULT_WEIGHTS.is_absolute()
    assert byte_export.differences(DEFAULT_WEIGHTS) == []  # the same files as protocol/data/byte_tokenizer
    tok = load_tokenizer(m.name)  # what a tool does with the model id
    assert tok.name == "byte" and tok.encode("héllo") == list("héllo".encode())


def test_a_weights_directory_is_served_by_its_absolute_path(tmp_path, monkeypatch):
    weights = tmp_path / "run1"
    byte_export.write(weights)
    monkeypatch.chdir(tmp_path)
    m = served_model(EngineConfig(model_path="run1"))
    assert (m.name, m.root, m.tokenizer_dir, m.aliases) == (str(weights), str(weights), str(weights), ("run1",))


def test_a_weights_directory_without_tokenizer_files_warns_and_points_at_the_byte_tokenizer(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="specgate.server"):
        m = served_model(EngineConfig(model_path=str(tmp_path)))
    assert (m.name, m.root, m.tokenizer_dir) == (str(tmp_path), str(tmp_path), BYTE_DIR)
    (message,) = [r.getMessage() for r in caplog.records]
    assert f"python -m protocol.byte_export --write {tmp_path}" in message and "tokenizer.json" in message


def test_served_model_name_overrides_the_id_and_the_paths_stay_aliases():
    m = served_model(TINY, "my-model")
    assert (m.name, m.root, m.aliases) == ("my-model", BYTE_DIR, ("random", BYTE_DIR, "random-tiny"))


def test_answer_name_echoes_an_accepted_name_and_refuses_others_with_404():
    m = served_model(TINY)
    assert m.answer_name(None) == BYTE_DIR
    assert [m.answer_name(n) for n in (BYTE_DIR, "random", "random-tiny")] == [BYTE_DIR, "random", "random-tiny"]
    with pytest.raises(ApiError) as e:
        m.answer_name("gpt-4")
    assert (e.value.status, e.value.param) == (404, "model")
    assert e.value.message == (f'model: "gpt-4" does not exist here; the served model is {BYTE_DIR!r} '
                               "(also accepted: 'random', 'random-tiny')")


def test_label_values_are_escaped():
    assert label_value('a"b\\c\nd') == 'a\\"b\\\\c\\nd'


# --- over HTTP, the session's DFlash server (random tiny weights) ----------------------------------
def test_v1_models_gives_the_tokenizer_directory_as_id_and_root(server):
    (card,) = server.call("GET", "/v1/models").json()["data"]
    assert {k: v for k, v in card.items() if k != "created"} == {
        "id": BYTE_DIR, "object": "model", "owned_by": "specgate", "root": BYTE_DIR, "parent": None,
        "max_model_len": 2048}
    info = server.call("GET", "/server_info").json()
    assert (info["served_model_name"], info["tokenizer_path"], info["tokenizer"]) == (BYTE_DIR, BYTE_DIR, "byte")
    assert load_tokenizer(info["tokenizer_path"]).name == "byte"


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "hi", "max_tokens": 1}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 1}),
])
def test_model_names(server, path, body):
    r = server.call("POST", path, dict(body, model="default"))
    assert r.status == 404, r.body
    err = r.json()["error"]
    assert (err["param"], err["code"]) == ("model", 404) and f"the served model is {BYTE_DIR!r}" in err["message"]
    for name in (BYTE_DIR, "random", "random-tiny"):
        r = server.call("POST", path, dict(body, model=name))
        assert r.status == 200 and r.json()["model"] == name, r.body


def test_reset_prefix_cache_is_flush_cache(server):
    server.wait_idle()
    for method in ("POST", "GET"):
        r = server.call(method, "/reset_prefix_cache")
        assert (r.status, r.json()) == (200, {"status": "ok", "message": "Cache flushed."})
    conn, _resp, _first = open_stream(server, "/generate", {
        "input_ids": [1, 2, 3], "stream": True, "sampling_params": {"max_new_tokens": 1500, "ignore_eos": True}})
    try:  # busy: 409 (AIPerf retries it) where /flush_cache answers SGLang's 400
        r = server.call("POST", "/reset_prefix_cache")
        assert r.status == 409 and r.json()["error"]["message"] == (
            "reset_prefix_cache: requests are running; the cache is flushed only when the server is idle")
        assert server.call("POST", "/flush_cache").status == 400
    finally:
        conn.close()
    server.wait_idle()


def test_speculation_metrics_under_vllm_and_sglang_names(server):
    server.wait_idle()
    before = server.metrics()
    trace = server.generate(input_ids=[7, 8, 9], sampling_params={"max_new_tokens": 40, "ignore_eos": True,
                                                                  "temperature": 0})["meta_info"]["spec_trace"]
    m = server.metrics()
    steps, accepted = len(trace), sum(commit - 1 for _, commit, _ in trace)
    vllm, sglang = f'{{engine="0",model_name="{BYTE_DIR}"}}', f'{{model_name="{BYTE_DIR}"}}'
    assert m["specgate_spec_verify_steps_total"] - before["specgate_spec_verify_steps_total"] == steps
    assert m["specgate_spec_accepted_tokens_total"] - before["specgate_spec_accepted_tokens_total"] == accepted
    assert m[f"vllm:spec_decode_num_drafts_total{vllm}"] == m["specgate_spec_verify_steps_total"]
    assert m[f"vllm:spec_decode_num_draft_tokens_total{vllm}"] == 7 * m["specgate_spec_verify_steps_total"]  # B-1
    assert m[f"vllm:spec_decode_num_accepted_tokens_total{vllm}"] == m["specgate_spec_accepted_tokens_total"]
    total_steps, total_accepted = m["specgate_spec_verify_steps_total"], m["specgate_spec_accepted_tokens_total"]
    assert m[f"sglang:spec_accept_length{sglang}"] == pytest.approx(1 + total_accepted / total_steps)
    assert m[f"sglang:spec_accept_rate{sglang}"] == pytest.approx(total_accepted / (7 * total_steps))
    text = server.call("GET", "/metrics").body.decode()
    for name, kind in [("vllm:spec_decode_num_drafts_total", "counter"), ("sglang:spec_accept_length", "gauge")]:
        assert f"# TYPE {name} {kind}\n" in text


def test_a_server_without_speculation_exports_no_peer_speculation_metrics():
    engine = AsyncEngine(TINY)
    loop = asyncio.new_event_loop()

    async def metrics() -> str:
        async with TestClient(TestServer(make_app(engine))) as client:
            r = await client.get("/metrics")
            return await r.text()

    try:
        text = loop.run_until_complete(metrics())
    finally:
        loop.close()
        engine.shutdown()
    assert "specgate_requests_total" in text and "vllm:" not in text and "sglang:" not in text
