"""Client disconnects free their memory; SIGTERM drains and exits 0; bad flags exit 2."""

from __future__ import annotations

import json
import threading
import time

import pytest

from engine import serve
from tests.engine.server.client import Server, open_stream

pytestmark = pytest.mark.slow


def memory_at_baseline(m: dict) -> bool:
    """Only the radix cache holds pages and state slots."""
    return (m["specgate_kv_pages_used"] == m["specgate_radix_pages"]
            and m["specgate_state_slots_used"] == m["specgate_radix_checkpoints"])


@pytest.mark.parametrize("path,body", [
    ("/generate", {"input_ids": list(range(40, 140)), "stream": True,
                   "sampling_params": {"max_new_tokens": 1500, "ignore_eos": True}}),
    ("/v1/completions", {"prompt": "x" * 100, "stream": True, "max_tokens": 1500, "ignore_eos": True}),
])
def test_disconnect_aborts_and_frees_memory(server, path, body):
    before = server.wait_idle()
    assert memory_at_baseline(before)
    conn, _resp, _first = open_stream(server, path, body)
    during = server.metrics()
    assert during["specgate_num_running_reqs"] == 1
    assert during["specgate_kv_pages_used"] > during["specgate_radix_pages"]
    conn.close()
    after = server.wait_idle(timeout=20)
    assert memory_at_baseline(after), after
    assert after["specgate_requests_aborted_total"] == before["specgate_requests_aborted_total"] + 1
    assert after["specgate_client_disconnects_total"] == before["specgate_client_disconnects_total"] + 1
    assert after["specgate_generation_tokens_total"] - before["specgate_generation_tokens_total"] < 1500


def test_disconnect_of_unstreamed_request(server):
    before = server.wait_idle()
    conn = server.connect()
    conn.request("POST", "/generate", body=json.dumps({"input_ids": [5, 6, 7], "sampling_params": {
        "max_new_tokens": 1500, "ignore_eos": True}}).encode(), headers=server.headers())
    deadline = time.monotonic() + 20
    while server.metrics()["specgate_num_running_reqs"] == 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    conn.close()
    after = server.wait_idle(timeout=20)
    assert memory_at_baseline(after)
    assert after["specgate_requests_aborted_total"] == before["specgate_requests_aborted_total"] + 1


def test_sigterm_drains_then_exits_zero(tmp_path):
    srv = Server(["--shutdown-timeout", "1.5"], tmp_path / "sigterm.log")
    try:
        answer = {}

        def long_request():
            answer["reply"] = srv.call("POST", "/generate", {
                "input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1500, "ignore_eos": True}})

        t = threading.Thread(target=long_request)
        t.start()
        deadline = time.monotonic() + 20
        while srv.metrics()["specgate_num_running_reqs"] == 0:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        t0 = time.monotonic()
        srv.proc.terminate()
        while srv.call("GET", "/health").status != 503:  # draining: health and new requests get 503
            assert time.monotonic() - t0 < 5
            time.sleep(0.02)
        r = srv.call("POST", "/generate", {"text": "hi"})
        assert r.status == 503 and "shutting down" in r.json()["error"]["message"]
        t.join(30)
        reply = answer["reply"]
        assert reply.status == 200  # the in-flight request got its answer, aborted after the timeout
        assert reply.json()["meta_info"]["finish_reason"]["type"] == "abort"
        assert srv.proc.wait(30) == 0, srv.log_tail()
        assert time.monotonic() - t0 < 30
    finally:
        srv.stop()


@pytest.mark.parametrize("argv,needle", [
    (["--tp-rendezvous", "127.0.0.1:1234"], "--tp-rendezvous needs --tp-size > 1"),
    (["--mamba-track-interval", "20"], "--mamba-track-interval (20) must be a multiple of --page-size"),
    (["--speculative-algorithm", "EAGLE"], "--speculative-algorithm"),
    (["--inject-fault", "nope"], "unknown fault 'nope'"),
    (["--port", "70000"], "--port"),
    (["--page-size", "0"], "--page-size must be >= 1"),
])
def test_bad_flags_exit_2(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        serve.main(argv)
    assert e.value.code == 2
    assert needle in capsys.readouterr().err


def test_help_documents_every_flag(capsys):
    with pytest.raises(SystemExit):
        serve.main(["--help"])
    out = capsys.readouterr().out
    for flag in ("--model-path", "--model-preset", "--seed", "--host", "--port", "--tp-size",
                 "--speculative-algorithm", "--speculative-num-draft-tokens", "--drafter-mode", "--scripted-accept",
                 "--mamba-radix-cache-strategy", "--mamba-track-interval", "--page-size", "--disable-radix-cache",
                 "--max-running-requests", "--max-total-tokens", "--chunked-prefill-size", "--inject-fault",
                 "--api-key", "--max-body-bytes", "--shutdown-timeout", "--served-model-name",
                 "--allow-unauthenticated", "--max-connections"):
        assert flag in out, flag
