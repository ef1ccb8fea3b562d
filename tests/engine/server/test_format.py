"""Pure answer-shaping helpers: stop trimming, text offsets, OpenAI stream hold-back, metrics text."""

from __future__ import annotations

import json

import pytest

from engine.io_struct import GenerateOutput, GenerateRequest, SamplingParams
from engine.server.format import output_text, text_offsets, token_str
from engine.server.metrics import render
from engine.server.openai import CompletionStream
from engine.server.openai_params import AnswerOptions
from engine.server.validate import GenerateCall
from protocol.tokenizer import EOS_ID

EURO = list("€".encode())  # 3 bytes, one character


def out(ids, reason=None, finished=True) -> GenerateOutput:
    return GenerateOutput(rid="r", prompt_tokens=1, output_ids=list(ids), finished=finished, finish_reason=reason)


@pytest.mark.parametrize("ids,reason,kwargs,want", [
    (b"abcSTOPxy", {"type": "stop", "matched": "STOP"}, {}, "abc"),
    (b"abcSTOPxy", {"type": "stop", "matched": "STOP"}, {"no_stop_trim": True}, "abcSTOPxy"),
    (b"abc;", {"type": "stop", "matched": ord(";")}, {}, "abc"),
    (b"abc;", {"type": "stop", "matched": ord(";")}, {"no_stop_trim": True}, "abc;"),
    (list(b"ab") + [EOS_ID], {"type": "stop", "matched": EOS_ID}, {}, "ab"),
    (list(b"ab") + [EOS_ID], {"type": "stop", "matched": EOS_ID}, {"skip_special_tokens": False,
                                                                    "no_stop_trim": True}, "ab<eos>"),
    (b"abc", {"type": "length", "length": 3}, {}, "abc"),
])
def test_output_text(ids, reason, kwargs, want):
    assert output_text(out(ids, reason), **kwargs) == want


def test_text_offsets_and_token_strings():
    ids = list(b"a") + EURO + list(b"b")
    assert text_offsets(ids) == [0, 1, 1, 1, 2]
    assert token_str(97) == "a" and token_str(0xE2) == "bytes:\\xe2" and token_str(EOS_ID) == "<eos>"


def test_completion_stream_holds_back_partial_characters_and_stop_prefixes():
    req = GenerateRequest(rid="c", input_ids=(1,), sampling=SamplingParams(stop=("END",)))
    stream = CompletionStream({"id": "c"}, GenerateCall(req=req), AnswerOptions())

    def delta(ids, reason=None):
        (ev,) = stream.events(out(ids, reason, finished=reason is not None))
        return json.loads(ev[len(b"data: "):])["choices"][0]["text"]

    assert delta(b"xyz" + bytes(EURO[:2])) == "x"  # partial euro sign and 2 chars that may start "END"
    assert delta(b"xyz" + bytes(EURO) + b"E") == "yz"
    assert delta(b"xyz" + bytes(EURO) + b"EN") == "€"
    assert delta(b"xyz" + bytes(EURO) + b"END", {"type": "stop", "matched": "END"}) == ""


def test_metrics_text_is_prometheus():
    stats = {"requests": 3, "running": 1, "waiting": 0, "kv_pages_used": 2, "kv_pages_total": 8,
             "avg_accept_length": 2.5}
    text = render(stats, {"inflight": 1, "disconnects": 0, "healthy": 1, "draining": 0})
    lines = text.splitlines()
    assert "# TYPE specgate_requests_total counter" in lines and "specgate_requests_total 3.0" in lines
    assert "specgate_token_usage 0.25" in lines and "specgate_spec_accept_length 2.5" in lines
    names = {ln.split()[0] for ln in lines if not ln.startswith("#")}
    assert all(f"# HELP {n} " in text for n in names)
