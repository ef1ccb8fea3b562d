"""The seeded load profile: determinism, request count, session shapes, prefixes and lengths."""

from __future__ import annotations

from collections import Counter

import pytest

from protocol.tokenizer import BYTE_TOKENIZER
from workloads import load_suite
from workloads.load import generate_load, main, shared_prefixes
from workloads.schema import DEFAULT_BLOCK_SIZE, MAX_TURN0_TOKENS, dumps_jsonl
from workloads.validate import parse_jsonl


@pytest.fixture(scope="module")
def profile():
    return load_suite("load")  # seed 0, 1024 requests


def test_same_seed_same_sessions_different_seed_differs(profile):
    assert generate_load(1024, seed=0) == profile
    other = generate_load(1024, seed=1)
    assert other != profile
    assert [s.turns[0].input_ids for s in other[:20]] != [s.turns[0].input_ids for s in profile[:20]]


@pytest.mark.parametrize("num_requests", [0, 1, 2, 7, 100, 1023])
def test_turns_add_up_to_num_requests(num_requests):
    sessions = generate_load(num_requests, seed=3)
    assert sum(len(s.turns) for s in sessions) == num_requests


def test_default_profile_has_1024_requests_in_1_to_4_turn_sessions(profile):
    assert sum(len(s.turns) for s in profile) == 1024
    turns = Counter(len(s.turns) for s in profile)
    assert set(turns) == {1, 2, 3, 4} and all(turns[t] >= 20 for t in turns)
    assert [s.session_id for s in profile[:2]] == ["load-s0-0000", "load-s0-0001"]
    assert len({s.session_id for s in profile}) == len(profile)


def test_shared_prefixes_are_shared(profile):
    prefixes = shared_prefixes()
    assert len(prefixes) == 4 and all(64 <= len(p) <= 300 and p.endswith("\n") for p in prefixes)
    used = Counter(s.meta["prefix"] for s in profile if s.meta["prefix"])
    assert set(used) == {f"prefix{i}" for i in range(4)} and min(used.values()) >= 10
    for s in profile:
        if s.meta["prefix"]:
            prefix = prefixes[int(s.meta["prefix"].removeprefix("prefix"))]
            assert s.turns[0].text.startswith(prefix) and s.meta["prefix_len"] == len(prefix)
            assert s.prompt_len >= len(prefix) + 16


def test_prompts_sit_around_boundaries_of_both_intervals(profile):
    assert {s.interval for s in profile} == {128, 256}
    for interval in (128, 256):
        mine = [s for s in profile if s.interval == interval]
        assert {s.meta["k"] for s in mine} == {1, 2, 3, 4}
        assert {s.meta["boundary_offset"] for s in mine} == set(range(-DEFAULT_BLOCK_SIZE - 4, 5))
    for s in profile:
        assert s.prompt_len == s.meta["k"] * s.interval + s.meta["boundary_offset"] == s.meta["turn0_len"]
        assert s.prompt_len <= MAX_TURN0_TOKENS


def test_lengths_in_range_and_tokens_match_text(profile):
    for s in profile:
        t0, *follow = s.turns
        assert 16 <= t0.max_new_tokens <= 256
        assert t0.input_ids == tuple(BYTE_TOKENIZER.encode(t0.text)) and t0.text.isascii()
        for t in follow:
            assert 8 <= len(t.suffix_ids) <= 32 and 16 <= t.max_new_tokens <= 64
            assert t.suffix_ids == tuple(BYTE_TOKENIZER.encode(t.suffix_text)) and t.input_ids is None
        assert s.max_total_tokens() <= 1900
    outs = {s.turns[0].max_new_tokens for s in profile}
    assert min(outs) <= 20 and max(outs) >= 250  # spread over the range


def test_jsonl_round_trip(profile):
    assert parse_jsonl(dumps_jsonl(profile), name="load.jsonl", default_suite="x") == profile


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_requests"):
        generate_load(-1)
    with pytest.raises(ValueError, match="intervals"):
        generate_load(10, intervals=(0,))


def test_describe(capsys):
    assert main(["--describe", "--num-requests", "50", "--seed", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("load profile: seed 2, 50 requests in ")
    assert "shared prefixes: prefix0" in out and "turns per session: 1:" in out
