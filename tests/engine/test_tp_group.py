"""The tensor-parallel rank group is closed: it listens on the given address only, its members must prove they
hold the shared secret, and calls travel as checked JSON (no pickle)."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import torch

from engine.tp.group import Group, GroupAuthError, rank_device, rank_mac
from engine.tp.local import free_port
from engine.tp.ranks import MIRRORED, decode_call, encode_call
from tests.netaddr import outside_address


def _pair(secrets: tuple[bytes, bytes], timeout_s: float = 20.0):
    """Build ranks 0 and 1 of a group in two threads; returns ({rank: Group or exception}, port)."""
    port = free_port()
    out: dict = {}

    def build(rank: int) -> None:
        try:
            out[rank] = Group(rank, 2, "127.0.0.1", port, timeout_s, secrets[rank])
        except Exception as e:  # noqa: BLE001 - inspected by the test
            out[rank] = e

    threads = [threading.Thread(target=build, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out, port


def test_same_secret_forms_a_group_that_all_reduces_and_broadcasts_json():
    groups, _ = _pair((b"s3cret", b"s3cret"))
    assert all(isinstance(g, Group) for g in groups.values()), groups
    xs = {r: torch.full((3,), float(r + 1)) for r in (0, 1)}
    got: dict = {}

    def work(r):
        groups[r].all_reduce(xs[r])
        got[r] = groups[r].broadcast_json(encode_call("copy_state", (3, 7), {}) if r == 0 else None)

    threads = [threading.Thread(target=work, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert xs[0].tolist() == xs[1].tolist() == [3.0, 3.0, 3.0]
    assert got[1] == ["copy_state", [3, 7], {}]
    assert decode_call(got[1]) == ("copy_state", [3, 7], {})


def test_a_rank_with_the_wrong_secret_is_refused_on_both_sides():
    groups, _ = _pair((b"right", b"wrong"))
    assert isinstance(groups[0], GroupAuthError) and "rank 1 failed authentication" in str(groups[0])
    assert isinstance(groups[1], GroupAuthError) and "rank 0 failed authentication" in str(groups[1])


def test_the_rendezvous_listens_on_the_given_address_only():
    outside = outside_address()
    port = free_port()
    t = threading.Thread(target=lambda: _quietly(lambda: Group(0, 2, "127.0.0.1", port, 5.0, b"k")), daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while True:  # the store comes up on loopback
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            break
        except OSError:
            assert time.monotonic() < deadline, "the rendezvous never listened on 127.0.0.1"
            time.sleep(0.05)
    if outside is not None:  # this machine's own outside address: nothing listens there
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((outside, port), timeout=2).close()
    t.join(30)  # rank 1 never comes: rank 0 times out after 5 s


def _quietly(fn):
    try:
        fn()
    except Exception:  # noqa: BLE001 - expected: the group never completes
        pass


@pytest.mark.parametrize("msg", [
    "stop", ["__import__", [], {}], ["extend", "x", {}], ["decode", [], []], ["a", "b"], 7, None,
])
def test_decode_call_refuses_anything_but_a_mirrored_call(msg):
    with pytest.raises(ValueError):
        decode_call(msg)


def test_decode_call_accepts_every_mirrored_call_and_stop():
    for name in (*MIRRORED, "stop"):
        assert decode_call(encode_call(name, (1, [2, 3]), {"conv_tracked": False}))[0] == name


def test_rank_mac_depends_on_secret_rank_and_nonces():
    base = rank_mac(b"k", 1, b"n" * 64)
    assert base != rank_mac(b"K", 1, b"n" * 64)
    assert base != rank_mac(b"k", 0, b"n" * 64)
    assert base != rank_mac(b"k", 1, b"m" * 64)


@pytest.mark.parametrize(("device", "rank", "visible", "expected"), [
    ("cpu", 1, 0, "cpu"),  # CPU ranks share the host
    ("cuda", 1, 1, "cuda:0"),  # a Ray rank actor sees only its own GPU
    ("cuda", 0, 1, "cuda:0"),
    ("cuda", 3, 4, "cuda:3"),  # `engine.serve --tp-size 4` on one machine: the rank-th visible GPU
    ("cuda:1", 2, 4, "cuda:1"),  # an explicit device is kept
])
def test_each_rank_computes_on_a_device_of_its_own(monkeypatch, device, rank, visible, expected):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    assert rank_device(device, rank) == expected


def test_a_cpu_group_all_reduces_through_its_gloo_group():
    """On CPU the model's all-reduces and the control messages share one gloo group (what TP on CPU always did)."""
    groups, _ = _pair((b"k", b"k"))
    assert all(g.device_pg is g.pg for g in groups.values())
