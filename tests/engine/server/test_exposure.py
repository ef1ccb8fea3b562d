"""A server that other machines can reach refuses to start without an API key, unless told to."""

from __future__ import annotations

import logging

import pytest

from engine import serve
from engine.server.config import is_loopback


@pytest.mark.parametrize("host,loopback", [
    ("127.0.0.1", True), ("127.8.9.10", True), ("localhost", True), ("LOCALHOST", True), ("::1", True),
    ("[::1]", True), ("::ffff:127.0.0.1", True),
    ("0.0.0.0", False), ("::", False), ("", False), ("192.0.2.7", False), ("10.0.0.1", False),
    ("2001:db8::1", False), ("fe80::1", False), ("::ffff:192.0.2.7", False), ("no-such-host.invalid", False),
])
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


class FakeEngine:
    def shutdown(self) -> None:
        pass


@pytest.fixture
def started(monkeypatch):
    """main() without an engine or a socket: what serve() would have been called with."""
    calls = []

    async def fake_serve(engine, server, api_key=None):
        calls.append((server, api_key))
        return 0

    monkeypatch.setattr(serve, "build_engine", lambda *a, **k: FakeEngine())
    monkeypatch.setattr(serve, "serve", fake_serve)
    return calls


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7", "2001:db8::1", ""])
def test_a_non_loopback_host_without_a_key_exits_2(host, started, capsys):
    with pytest.raises(SystemExit) as e:
        serve.main(["--host", host], environ={})
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"--host {host} is not a loopback address and no API key is set" in err
    for way in ("--api-key-file", "SPECGATE_API_KEY", "--allow-unauthenticated", "127.0.0.1"):
        assert way in err, way
    assert started == []


def test_allow_unauthenticated_starts_and_warns(started, caplog):
    with caplog.at_level(logging.WARNING, logger="specgate.serve"):
        assert serve.main(["--host", "0.0.0.0", "--allow-unauthenticated"], environ={}) == 0
    (server, api_key), = started
    assert server.host == "0.0.0.0" and api_key is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["serving --host 0.0.0.0 without an API key (--allow-unauthenticated): anyone who can "
                        "reach it can generate"]


@pytest.mark.parametrize("argv,environ", [
    (["--host", "0.0.0.0"], {"SPECGATE_API_KEY": "k"}),  # how the harness's replicas get theirs
    (["--host", "0.0.0.0", "--api-key", "k"], {}),
])
def test_a_non_loopback_host_with_a_key_starts_quietly(argv, environ, started, caplog):
    with caplog.at_level(logging.WARNING, logger="specgate.serve"):
        assert serve.main(argv, environ=environ) == 0
    assert [api_key for _, api_key in started] == ["k"]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_loopback_host_needs_no_key(started, caplog):
    with caplog.at_level(logging.WARNING, logger="specgate.serve"):
        assert serve.main(["--host", "::1"], environ={}) == 0
    assert [api_key for _, api_key in started] == [None]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
