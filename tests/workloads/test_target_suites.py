"""Suites built for the target: its tokenizer (a BPE trained here), its intervals and block size, --seed."""

from __future__ import annotations

import json

import pytest

from protocol.tokenizer import BYTE_TOKENIZER
from tests.workloads.bpe import VOCAB, train_bpe
from workloads import WorkloadError, committed_frozen_fits, load_suite
from workloads.corpus import heldout_text
from workloads.frozen import FROZEN_PATH, TURN1_SUFFIX, generate_frozen
from workloads.load import SUFFIX_TOKENS, generate_load, shared_prefixes
from workloads.schema import dumps_jsonl
from workloads.validate import validate_file


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    return train_bpe(tmp_path_factory.mktemp("bpe"))


def test_the_bpe_is_not_the_byte_tokenizer(bpe):
    ids = bpe.encode("    def __init__(self, name):\n")
    assert bpe.vocab_size == VOCAB and len(ids) < 12  # 30 characters in a handful of tokens


@pytest.mark.parametrize("intervals, block", [((128, 256), 8), ((512,), 16)])
def test_frozen_prompts_have_exact_lengths_in_the_targets_tokenizer(bpe, intervals, block):
    sessions = generate_frozen(intervals, block, bpe)
    held = heldout_text()
    for s in sessions:
        t0 = s.turns[0]
        assert len(t0.input_ids) == s.meta["turn0_len"] and all(0 <= t < VOCAB for t in t0.input_ids)
        assert t0.text == bpe.decode(t0.input_ids)
        if s.group not in ("shared", "tree"):  # one slice of one held-out file; shared prompts join two
            assert t0.text in held
        if s.group == "tree":  # branch turns: their own text, exact lengths in the target's tokens
            fan = s.session_id.endswith("-fan")
            assert [len(t.suffix_ids) for t in s.turns[1:]] == ([48, 27, 27] if fan else
                                                                [s.meta["sibling_checkpoint"] - 16])
            assert all(t.suffix_text == bpe.decode(t.suffix_ids) for t in s.turns[1:])
        else:
            assert s.turns[1].suffix_ids == tuple(bpe.encode(TURN1_SUFFIX))
    for interval in intervals:
        offsets = [s for s in sessions if s.interval == interval and s.group == "offset"]
        cases = sorted((s.meta["k"], s.meta["boundary_offset"]) for s in offsets)
        assert cases == [(k, o) for k in (1, 2) for o in range(-block, 2)]
        assert all(s.prompt_len == s.meta["k"] * interval + s.meta["boundary_offset"] for s in offsets)
        stem = next(s for s in sessions if s.session_id == f"frozen-i{interval}-shared-stem").turns[0].input_ids
        for s in sessions:
            if s.interval == interval and s.group == "shared" and s.meta["prefix_ends"] != "stem":
                n = s.meta["shared_prefix_len"]
                ids = s.turns[0].input_ids
                assert ids[:n] == stem[:n] and (n == len(stem) or ids[n] != stem[n])  # the prefix ends there


def test_a_server_at_512_with_block_16_gets_offsets_minus_16_to_plus_1():
    sessions = load_suite("frozen", intervals=(512,), block_size=16)
    offsets = {(s.meta["boundary"], s.meta["boundary_offset"]) for s in sessions if s.group == "offset"}
    assert offsets == {(b, o) for b in (512, 1024) for o in range(-16, 2)}
    assert {s.interval for s in sessions} == {512}
    assert all(s.meta["block_size"] == 16 for s in sessions)
    # what does not fit the built-in 2048-token context is left out: the 4-boundary multi case (4*512-2)
    assert "frozen-i512-multi3" not in {s.session_id for s in sessions}
    assert "frozen-i512-multi3" in {s.session_id for s in generate_frozen((512,), 16, max_context=None)}


def test_the_committed_suite_is_the_default_targets_and_only_theirs(bpe):
    committed = validate_file(FROZEN_PATH)
    for kwargs in ({}, {"intervals": (128,)}, {"intervals": (256,)}, {"tokenizer": BYTE_TOKENIZER}):
        assert load_suite("frozen", **kwargs) == committed, kwargs
    assert dumps_jsonl(generate_frozen()) == FROZEN_PATH.read_text()
    assert not committed_frozen_fits((128, 256), 16, BYTE_TOKENIZER, 0)
    assert not committed_frozen_fits((128, 256), 8, bpe, 0)
    assert not committed_frozen_fits((128, 256), 8, BYTE_TOKENIZER, 1)
    assert not committed_frozen_fits((128, 512), 8, BYTE_TOKENIZER, 0)


def test_seed_moves_the_frozen_text_but_not_the_lengths():
    a, b = generate_frozen(seed=0), generate_frozen(seed=3)
    assert [s.session_id for s in a] == [s.session_id for s in b]
    assert [s.prompt_len for s in a] == [s.prompt_len for s in b]
    assert sum(x.turns[0].text != y.turns[0].text for x, y in zip(a, b, strict=True)) == len(a)
    assert dumps_jsonl(generate_frozen(seed=3)) == dumps_jsonl(b)  # same seed, same suite


@pytest.mark.parametrize("intervals, block", [((128, 256), 8), ((512,), 16)])
def test_load_prompts_have_exact_lengths_in_the_targets_tokenizer(bpe, intervals, block):
    sessions = generate_load(num_requests=200, seed=5, intervals=intervals, block_size=block, tokenizer=bpe)
    assert sum(len(s.turns) for s in sessions) == 200
    prefixes = [tuple(bpe.encode(p)) for p in shared_prefixes()]
    for s in sessions:
        t0 = s.turns[0]
        assert len(t0.input_ids) == s.meta["k"] * s.interval + s.meta["boundary_offset"]
        assert -block - 4 <= s.meta["boundary_offset"] <= 4 and s.interval in intervals
        assert all(0 <= t < VOCAB for t in t0.input_ids) and t0.text == bpe.decode(t0.input_ids)
        if s.meta["prefix"]:
            prefix = prefixes[int(s.meta["prefix"].removeprefix("prefix"))]
            assert t0.input_ids[: len(prefix)] == prefix and s.meta["prefix_len"] == len(prefix)
        for t in s.turns[1:]:
            assert SUFFIX_TOKENS[0] <= len(t.suffix_ids) <= SUFFIX_TOKENS[1]
            assert t.suffix_ids[0] == bpe.encode("\n")[0] and t.suffix_text == bpe.decode(t.suffix_ids)
    offsets = {s.meta["boundary_offset"] for s in sessions}
    assert min(offsets) == -block - 4 and max(offsets) == 4


def test_user_files_use_the_targets_tokenizer(bpe, tmp_path):
    text = "import os\nprint(os.getcwd())\n"
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"session_id": "a", "turns": [{"max_new_tokens": 4, "text": text}]}) + "\n")
    (s,) = validate_file(path, tokenizer=bpe)
    assert s.turns[0].input_ids == tuple(bpe.encode(text)) and len(s.turns[0].input_ids) < len(text)
    ids = bpe.encode(text)
    path.write_text(json.dumps({"session_id": "b", "turns": [{"max_new_tokens": 4, "input_ids": ids}]}) + "\n")
    (s,) = validate_file(path, tokenizer=bpe)
    assert s.turns[0].text == text  # decoded with the target's tokenizer
    path.write_text(json.dumps({"session_id": "c", "turns": [{"max_new_tokens": 4, "input_ids": [5, VOCAB]}]}))
    with pytest.raises(WorkloadError) as e:
        validate_file(path, tokenizer=bpe)
    assert str(e.value) == (f"mine.jsonl:1: field 'turns[0].input_ids[1]': token id {VOCAB} is outside the "
                            f"vocabulary 0..{VOCAB - 1} of tokenizer {bpe.name}")
    # a real model's ids are fine when its tokenizer is unknown (the harness then sends them as given) ...
    path.write_text(json.dumps({"session_id": "d", "turns": [{"max_new_tokens": 4, "input_ids": [151644, 8]}]}))
    assert validate_file(path, tokenizer=None)[0].turns[0].input_ids == (151644, 8)
    # ... but text cannot be encoded without it
    path.write_text(json.dumps({"session_id": "e", "turns": [{"max_new_tokens": 4, "text": "hi"}]}))
    with pytest.raises(WorkloadError, match=r"field 'turns\[0\].text': encoding text needs the target's "
                                            r"tokenizer: pass --tokenizer"):
        validate_file(path, tokenizer=None)
