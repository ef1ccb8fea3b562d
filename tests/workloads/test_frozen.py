"""The frozen boundary suite: determinism, the --check gate, and coverage."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from protocol.boundaries import next_boundary
from protocol.tokenizer import BYTE_TOKENIZER
from workloads import load_suite
from workloads.frozen import FROZEN_PATH, TURN1_SUFFIX, generate_frozen, main
from workloads.schema import DEFAULT_BLOCK_SIZE, MAX_TURN0_TOKENS, Turn, dumps_jsonl

REPO_ROOT = Path(__file__).resolve().parents[2]
INTERVALS = (128, 256)
B = DEFAULT_BLOCK_SIZE
FIRST_56_SHA = "d9ba4d32b17b369d"  # the 56 sessions before the shared-prefix group was added
FIRST_68_SHA = "1086395fca5e1c7d"  # the 68 before the tree group was added
TWO_TURN_GROUPS = ("offset", "multi", "control", "shared")


@pytest.fixture(scope="module")
def suite():
    return load_suite("frozen")


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workloads.frozen", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)


def test_generator_is_deterministic_and_matches_committed_file(suite):
    first, second = generate_frozen(), generate_frozen()
    assert first == second
    assert dumps_jsonl(first) == FROZEN_PATH.read_text(encoding="utf-8")
    assert suite == first


def test_check_passes_on_committed_file():
    proc = _run_cli("--check")
    assert proc.returncode == 0, proc.stderr
    assert "matches the generator" in proc.stdout


def test_check_fails_on_edited_copy(tmp_path):
    lines = FROZEN_PATH.read_text(encoding="utf-8").splitlines(keepends=True)
    obj = json.loads(lines[6])
    obj["turns"][0]["max_new_tokens"] += 1
    lines[6] = json.dumps(obj, separators=(",", ":")) + "\n"
    edited = tmp_path / "frozen.jsonl"
    edited.write_text("".join(lines), encoding="utf-8")
    proc = _run_cli("--check", "--file", str(edited))
    assert proc.returncode == 1
    assert f"frozen.jsonl:7: differs from the generator (session {obj['session_id']})" in proc.stderr


def test_check_fails_on_truncated_copy(tmp_path, capsys):
    lines = FROZEN_PATH.read_text(encoding="utf-8").splitlines(keepends=True)
    short = tmp_path / "short.jsonl"
    short.write_text("".join(lines[:-1]), encoding="utf-8")
    assert main(["--check", "--file", str(short)]) == 1
    assert "71 lines, the generator writes 72" in capsys.readouterr().err


def test_write_reproduces_committed_bytes(tmp_path):
    out = tmp_path / "regen.jsonl"
    assert main(["--write", "--file", str(out)]) == 0
    assert out.read_bytes() == FROZEN_PATH.read_bytes()


def test_describe_prints_coverage(capsys):
    assert main(["--describe"]) == 0
    out = capsys.readouterr().out
    for interval in INTERVALS:
        assert f"interval {interval}: 36 sessions (offset 20, multi 4, control 4, shared 6, tree 2)" in out
    assert "boundaries spanned by turn 0 (multi): 2:1 3:2 4:1" in out
    assert "      -8      2  120, 248          24, 24" in out
    assert "    mid          165     188       84  mid-page, mid-edge" in out
    # a cold turn 0 is checkpointed on the 64-token grid: 120..127 -> 64, 248..255 -> 192 (not multiples of I)
    assert ("  turn-0 prefill checkpoints (deepest 64-aligned position): 64:10 128:6 192:10 256:4 320:1 448:1; "
            "22 not a multiple of I; none (prompt < 64): 4") in out
    assert "    fan/2       192       16  first 165      deeper" in out
    assert "    sib/1       216       16  first 40       checkpoint+sibling" in out
    assert "total: 72 sessions (36 at I=128, 36 at I=256), 148 requests" in out


def test_counts_per_interval_and_group(suite):
    assert len(suite) == 72
    assert len({s.session_id for s in suite}) == 72
    assert sum(len(s.turns) for s in suite) == 148
    for interval in INTERVALS:
        mine = [s for s in suite if s.interval == interval]
        assert len(mine) == 36
        assert Counter(s.group for s in mine) == {"offset": 20, "multi": 4, "control": 4, "shared": 6, "tree": 2}
        assert all(s.suite == "frozen" and s.targets for s in mine)
        assert [len(s.turns) for s in mine if s.group not in TWO_TURN_GROUPS] == [4, 2]
        assert all(len(s.turns) == 2 for s in mine if s.group in TWO_TURN_GROUPS)


@pytest.mark.parametrize("interval", INTERVALS)
def test_every_offset_at_two_boundaries(suite, interval):
    offset_cases = {(s.meta["k"], s.meta["boundary_offset"]): s
                    for s in suite if s.interval == interval and s.group == "offset"}
    expected = {(k, off) for k in (1, 2) for off in range(-B, 2)}
    assert set(offset_cases) == expected
    for (k, off), s in offset_cases.items():
        assert s.prompt_len == k * interval + off == s.meta["turn0_len"]
        name = f"m{-off}" if off < 0 else f"p{off}"
        assert s.session_id == f"frozen-i{interval}-k{k}-{name}"


def test_turn0_decoding_crosses_the_next_boundary(suite):
    for s in suite:
        if s.group in ("control", "tree") or s.group == "shared" and s.turns[0].max_new_tokens == 24:
            continue
        nb = next_boundary(s.prompt_len, s.interval)
        assert s.turns[0].max_new_tokens == nb - s.prompt_len + 16 <= 300
        assert s.meta["next_boundary"] == nb
        assert s.meta["boundaries_spanned"] == (s.prompt_len + s.turns[0].max_new_tokens) // s.interval


def test_on_boundary_prompt_crosses_the_following_boundary(suite):
    s = next(s for s in suite if s.session_id == "frozen-i256-k1-p0")
    assert (s.prompt_len, s.turns[0].max_new_tokens, s.meta["boundaries_spanned"]) == (256, 272, 2)


@pytest.mark.parametrize("interval", INTERVALS)
def test_multi_cases_span_two_to_four_boundaries(suite, interval):
    multi = [s for s in suite if s.interval == interval and s.group == "multi"]
    assert [s.session_id for s in multi] == [f"frozen-i{interval}-multi{n}" for n in range(1, 5)]
    assert [s.prompt_len for s in multi] == [2 * interval - 3, 3 * interval - 5, 4 * interval - 2,
                                             2 * interval + 3]
    assert [s.meta["boundaries_spanned"] for s in multi] == [2, 3, 4, 3]


@pytest.mark.parametrize("interval", INTERVALS)
def test_controls_never_reach_a_boundary(suite, interval):
    controls = [s for s in suite if s.interval == interval and s.group == "control"]
    assert [s.session_id for s in controls] == [f"frozen-i{interval}-ctrl{n}" for n in range(1, 5)]
    for s in controls:
        t0, t1 = s.turns
        end = s.prompt_len + t0.max_new_tokens + len(t1.suffix_ids) + t1.max_new_tokens
        assert end == s.max_total_tokens()
        assert end + B < next_boundary(s.prompt_len, interval) == interval
        assert s.meta["boundaries_spanned"] == 0 and s.meta["boundary_offset"] is None


def test_tokens_are_the_texts_encoding(suite):
    suffix_ids = tuple(BYTE_TOKENIZER.encode(TURN1_SUFFIX))
    assert 8 <= len(suffix_ids) <= 24
    texts = set()
    for s in (s for s in suite if s.group in TWO_TURN_GROUPS):
        t0, t1 = s.turns
        assert t0.text.isascii() and t0.input_ids == tuple(BYTE_TOKENIZER.encode(t0.text))
        assert t0.suffix_ids is None and t1.input_ids is None and t1.text is None
        assert (t1.suffix_text, t1.suffix_ids, t1.max_new_tokens) == (TURN1_SUFFIX, suffix_ids, 32)
        texts.add(t0.text)
    assert len(texts) == 68  # every case has its own text


def test_lengths_fit_the_context(suite):
    assert max(s.prompt_len for s in suite) == 1022 <= MAX_TURN0_TOKENS
    assert max(s.max_total_tokens() for s in suite) <= 2048


@pytest.mark.parametrize("interval", INTERVALS)
def test_shared_prefix_group_ends_each_prefix_where_it_says(suite, interval):
    shared = [s for s in suite if s.interval == interval and s.group == "shared"]
    assert [s.session_id.rsplit("-", 1)[1] for s in shared] == ["stem", "ckpt", "page", "mid", "low", "deep"]
    stem = shared[0].turns[0].input_ids
    assert len(stem) == 2 * interval - 8
    lengths = {"ckpt": interval, "page": interval + 16, "mid": interval + 37, "low": interval - 24,
               "deep": 2 * interval - 8}
    for s in shared[1:]:
        ids = s.turns[0].input_ids
        common = next((i for i, (a, b) in enumerate(zip(ids, stem, strict=False)) if a != b),
                      min(len(ids), len(stem)))
        name = s.session_id.rsplit("-", 1)[1]
        assert common == s.meta["shared_prefix_len"] == lengths[name]
        assert len(ids) > common and s.meta["stem"] == shared[0].session_id
    # the prefix ends: on boundary I, on a page boundary past it, mid-page, mid-page below I, the stem's end
    assert [(lengths[n] % interval, lengths[n] % 16) for n in ("ckpt", "page", "mid", "low")] == [
        (0, 0), (16, 0), (37, 5), (interval - 24, 8)]


def test_the_earlier_sessions_kept_their_text():
    """Adding the shared group, then the tree group, must not move the other cases' prompts (each is generated
    after them)."""
    lines = FROZEN_PATH.read_text(encoding="utf-8").splitlines()
    assert [json.loads(x)["group"] for x in lines[:56]].count("shared") == 0
    assert hashlib.sha256("\n".join(lines[:56]).encode()).hexdigest()[:16] == FIRST_56_SHA
    assert [json.loads(x)["group"] for x in lines[68:]] == ["tree"] * 4
    assert hashlib.sha256("\n".join(lines[:68]).encode()).hexdigest()[:16] == FIRST_68_SHA


def _history_len(t0: Turn) -> int:
    return len(t0.input_ids) + t0.max_new_tokens


@pytest.mark.parametrize("interval", INTERVALS)
def test_tree_group_branches_exactly_where_it_says(suite, interval):
    fan, sib = [s for s in suite if s.interval == interval and s.group == "tree"]
    assert (fan.session_id, sib.session_id) == (f"frozen-i{interval}-tree-fan", f"frozen-i{interval}-tree-sib")
    t0, t1, t2, t3 = fan.turns
    assert (len(t0.input_ids), t0.max_new_tokens) == (interval - 8, 24)  # crosses I in decoding, 16 past it
    assert (t1.branch_at, len(t1.suffix_ids), t2.branch_at, t3.branch_at) == (None, 48, interval + 37,
                                                                              interval + 37)
    # as the engine sees them (each turn generates its max_new_tokens): the branch suffixes leave turn 1's
    # history, and each other, at their first token, 37 past checkpoint I and 5 into a 16-token page
    history1 = list(t0.input_ids) + [0] * t0.max_new_tokens + list(t1.suffix_ids)
    at = interval + 37 - _history_len(t0)
    assert len({t1.suffix_ids[at], t2.suffix_ids[0], t3.suffix_ids[0]}) == 3
    assert interval + 37 + len(t2.suffix_ids) == len(history1) == interval + 64  # branches as long as turn 1
    assert fan.meta["tree_shapes"] == [[], ["checkpoint"], ["deeper"], ["split"]]
    assert fan.meta["branch_at"] == interval + 37 and (interval + 37) % 16 == 5
    # the sibling shares the fan's first 40 tokens, then its turn 1 goes on with the fan's prompt to the fan's
    # prefill checkpoint (the 64-token grid below I - 8) and leaves it there
    s0, s1 = sib.turns
    ckpt = (interval - 8) // 64 * 64
    assert s0.input_ids[:40] == t0.input_ids[:40] and s0.input_ids[40] != t0.input_ids[40]
    assert s1.branch_at == 40 and s1.suffix_ids[: ckpt - 40] == t0.input_ids[40:ckpt]
    assert s1.suffix_ids[ckpt - 40] != t0.input_ids[ckpt]
    assert sib.meta["tree_shapes"] == [[], ["checkpoint", "sibling"]] and sib.meta["sibling_checkpoint"] == ckpt
    for s in (fan, sib):
        assert s.turns[0].text.isascii() and s.turns[0].input_ids == tuple(BYTE_TOKENIZER.encode(s.turns[0].text))
        assert all(t.suffix_ids == tuple(BYTE_TOKENIZER.encode(t.suffix_text)) for t in s.turns[1:])
