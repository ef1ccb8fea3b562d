"""User workload files: a valid file loads; malformed ones name the line and the field."""

from __future__ import annotations

import json

import pytest

from protocol.tokenizer import BYTE_TOKENIZER
from workloads import WorkloadError, list_suites, load_suite, validate_file
from workloads.schema import Session, Turn, dumps_jsonl

GOOD = {"session_id": "s1", "turns": [{"text": "def f(x):\n", "max_new_tokens": 8}]}


def _file(tmp_path, *lines, name="bad.jsonl"):
    path = tmp_path / name
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
    return path


def _session(**over):
    obj = json.loads(json.dumps(GOOD))
    obj.update(over)
    return obj


def test_list_suites():
    assert list_suites() == ["frozen", "load", "cover"]


def test_valid_user_file_loads(tmp_path):
    path = _file(
        tmp_path,
        GOOD,
        "",  # blank lines are skipped
        {"session_id": "s2", "suite": "mine", "interval": 128, "group": "g", "targets": "t", "meta": {"a": 1},
         "turns": [{"input_ids": [104, 105], "max_new_tokens": 4},
                   {"suffix_text": "\n# more\n", "max_new_tokens": 6},
                   {"suffix_ids": [10], "suffix_text": "\n", "max_new_tokens": 2}]},
        {"session_id": "s3",
         "turns": [{"text": "x = 1\n", "input_ids": list(b"x = 1\n"), "max_new_tokens": 1},
                   {"suffix_text": "", "max_new_tokens": 1}]},
        name="my_cases.jsonl",
    )
    s1, s2, s3 = load_suite(str(path))
    assert s1 == Session("s1", "my_cases", None, "user", "", {},
                         (Turn(8, input_ids=tuple(BYTE_TOKENIZER.encode("def f(x):\n")), text="def f(x):\n"),))
    assert (s2.suite, s2.interval, s2.group, s2.targets, s2.meta) == ("mine", 128, "g", "t", {"a": 1})
    assert s2.turns[0] == Turn(4, input_ids=(104, 105), text="hi")
    assert s2.turns[1] == Turn(6, suffix_ids=tuple(b"\n# more\n"), suffix_text="\n# more\n")
    assert s2.turns[2] == Turn(2, suffix_ids=(10,), suffix_text="\n")
    assert s3.turns[1] == Turn(1, suffix_ids=(), suffix_text="")


def test_ids_only_with_special_token_has_no_text(tmp_path):
    path = _file(tmp_path, {"session_id": "s", "turns": [{"input_ids": [65, 259], "max_new_tokens": 1}]})
    assert validate_file(path)[0].turns[0] == Turn(1, input_ids=(65, 259), text=None)


MALFORMED = [
    # (lines, line number, field, message after "field '...': ")
    ([GOOD, "{not json"], 2, None,
     "invalid JSON: Expecting property name enclosed in double quotes (column 2)"),
    ([[1, 2]], 1, None, "expected a JSON object (one session per line), got list"),
    ([{"turns": GOOD["turns"]}], 1, "session_id", "missing"),
    ([{"session_id": "s"}], 1, "turns", "missing"),
    ([_session(turns=[])], 1, "turns", "must be a non-empty list of turns"),
    ([_session(session_id=7)], 1, "session_id", "must be a non-empty string, got 7"),
    ([_session(interval="128")], 1, "interval", 'must be a positive integer or null, got "128"'),
    ([_session(meta=[1])], 1, "meta", "must be an object, got list"),
    ([_session(colour="red")], 1, "colour", "unknown field (allowed: session_id, suite, interval, group, "
                                            "targets, meta, turns)"),
    ([_session(turns=[{"text": "x"}])], 1, "turns[0].max_new_tokens", "missing"),
    ([_session(turns=[{"text": "x", "max_new_tokens": "8"}])], 1, "turns[0].max_new_tokens",
     'must be a positive integer, got "8"'),
    ([_session(turns=[{"text": "x", "max_new_tokens": True}])], 1, "turns[0].max_new_tokens",
     "must be a positive integer, got true"),
    ([GOOD | {"session_id": "a"}, GOOD | {"session_id": "b"},
      _session(session_id="c",
               turns=[{"text": "x", "max_new_tokens": 4}, {"suffix_text": "y", "max_new_tokens": -4}])],
     3, "turns[1].max_new_tokens", "must be a positive integer, got -4"),
    ([_session(turns=[{"input_ids": [1, 2, 260], "max_new_tokens": 1}])], 1, "turns[0].input_ids[2]",
     "token id 260 is outside the vocabulary 0..259"),
    ([_session(turns=[{"input_ids": [-1], "max_new_tokens": 1}])], 1, "turns[0].input_ids[0]",
     "token id -1 is outside the vocabulary 0..259"),
    ([_session(turns=[{"input_ids": [1, "a"], "max_new_tokens": 1}])], 1, "turns[0].input_ids[1]",
     'must be an integer token id, got "a"'),
    ([_session(turns=[{"input_ids": "abc", "max_new_tokens": 1}])], 1, "turns[0].input_ids",
     "must be a list of token ids, got str"),
    ([_session(turns=[{"input_ids": [], "max_new_tokens": 1}])], 1, "turns[0].input_ids",
     "must not be empty"),
    ([_session(turns=[{"max_new_tokens": 1}])], 1, "turns[0].input_ids",
     "missing: give 'input_ids' or 'text'"),
    ([_session(turns=[{"text": 5, "max_new_tokens": 1}])], 1, "turns[0].text", "must be a string, got int"),
    ([_session(turns=[{"text": "ab", "input_ids": [97, 99], "max_new_tokens": 1}])], 1, "turns[0].input_ids",
     "does not match the tokenizer's encoding of 'text' (2 ids vs 2; first difference at index 1)"),
    ([_session(turns=[{"text": "a", "suffix_text": "b", "max_new_tokens": 1}])], 1, "turns[0].suffix_text",
     "turn 0 carries the prompt in 'input_ids'/'text', not a suffix or a branch point"),
    ([_session(turns=[{"text": "a", "branch_at": 0, "max_new_tokens": 1}])], 1, "turns[0].branch_at",
     "turn 0 carries the prompt in 'input_ids'/'text', not a suffix or a branch point"),
    ([_session(turns=[{"text": "a", "max_new_tokens": 1}, {"suffix_text": "b", "branch_at": -1, "max_new_tokens": 1}])],
     1, "turns[1].branch_at", "must be a non-negative integer (tokens of the previous turn's input and output to "
     "keep), got -1"),
    ([_session(turns=[{"text": "a", "max_new_tokens": 1}, {"suffix_text": "b", "branch_at": "2",
                                                            "max_new_tokens": 1}])],
     1, "turns[1].branch_at", "must be a non-negative integer (tokens of the previous turn's input and output to "
     "keep), got \"2\""),
    ([_session(turns=[{"text": "a", "max_new_tokens": 1}, {"text": "b", "max_new_tokens": 1}])], 1,
     "turns[1].text", "only turn 0 has a prompt; later turns give 'suffix_ids'/'suffix_text'"),
    ([_session(turns=[{"text": "a", "max_new_tokens": 1}, {"suffix_ids": [300], "max_new_tokens": 1}])], 1,
     "turns[1].suffix_ids[0]", "token id 300 is outside the vocabulary 0..259"),
    ([_session(turns=[{"text": "a", "max_new_token": 1}])], 1, "turns[0].max_new_token",
     "unknown field (allowed: max_new_tokens, input_ids, text, suffix_ids, suffix_text, branch_at)"),
    ([_session(turns=["x"])], 1, "turns[0]", "must be an object, got str"),
    ([GOOD, GOOD], 2, "session_id", "duplicate 's1' (first on line 1)"),
    ([_session(turns=[{"text": "a" * 2000, "max_new_tokens": 49}])], 1, "turns",
     "the session can reach 2049 tokens (prompt + suffixes + max_new_tokens), over the 2048-token context"),
]


@pytest.mark.parametrize("lines,lineno,field,problem", MALFORMED)
def test_malformed_file_names_line_and_field(tmp_path, lines, lineno, field, problem):
    path = _file(tmp_path, *lines)
    with pytest.raises(WorkloadError) as err:
        validate_file(path)
    where = f"bad.jsonl:{lineno}: " + (f"field '{field}': " if field else "")
    assert str(err.value) == where + problem
    assert (err.value.line, err.value.field, err.value.path) == (lineno, field, "bad.jsonl")
    assert isinstance(err.value, ValueError)


def test_load_suite_validates_user_files(tmp_path):
    path = _file(tmp_path, _session(turns=[{"text": "x", "max_new_tokens": 0}]))
    with pytest.raises(WorkloadError, match=r"^bad\.jsonl:1: field 'turns\[0\]\.max_new_tokens': "):
        load_suite(str(path))


def test_empty_file_unknown_suite_and_bad_encoding(tmp_path):
    with pytest.raises(WorkloadError, match="^empty.jsonl: no sessions"):
        validate_file(_file(tmp_path, "", name="empty.jsonl"))
    with pytest.raises(WorkloadError, match="unknown suite 'nope'"):
        load_suite("nope")
    raw = tmp_path / "latin.jsonl"
    raw.write_bytes(json.dumps(GOOD).encode() + b"\n" + b'{"session_id": "caf\xe9"}\n')
    with pytest.raises(WorkloadError, match="^latin.jsonl:2: not valid UTF-8$"):
        validate_file(raw)


def test_line_numbers_count_blank_lines(tmp_path):
    path = _file(tmp_path, GOOD, "", "", _session(session_id="s2", interval=0))
    with pytest.raises(WorkloadError, match="^bad.jsonl:4: field 'interval'"):
        validate_file(path)


def test_a_branch_turn_keeps_part_of_its_history(tmp_path):
    """`branch_at` cuts the previous turn's input + output before the suffix; past their end, all of it is kept."""
    line = _session(turns=[{"text": "abcd", "max_new_tokens": 2}, {"suffix_text": "XY", "branch_at": 3,
                                                                    "max_new_tokens": 1},
                           {"suffix_text": "Z", "branch_at": 99, "max_new_tokens": 1}, {"suffix_text": "!",
                                                                                          "max_new_tokens": 1}])
    [s] = validate_file(_file(tmp_path, line))
    assert [t.branch_at for t in s.turns] == [None, 3, 99, None]
    t1 = s.turn_input(1, list(b"abcd"), list(b"ef"))
    assert bytes(t1) == b"abcXY"
    assert bytes(s.turn_input(2, t1, list(b"g"))) == b"abcXYgZ"
    assert bytes(s.turn_input(3, list(b"abcXYgZ"), list(b"h"))) == b"abcXYgZh!"
    again = tmp_path / "again.jsonl"
    again.write_text(dumps_jsonl([s]), encoding="utf-8")
    assert validate_file(again) == [s]  # the JSON form keeps it
