"""The analysis's compact per-row stores against the dicts they replace: SeenKeys (keys met, by stem), RowLengths,
PrefixDigests, the index pass's earlier turns, and TokenFacts' columns."""

from __future__ import annotations

import os
import pickle
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from reports.analyze_run import _Turns
from reports.facts import TokenFacts
from reports.row_values import PrefixDigests, RowLengths
from reports.seen_keys import KeyMap, SeenKeys
from reports.window import WindowFact


class _Colliding(KeyMap):
    BUFFER = 4
    key_hash = staticmethod(lambda key: len(key) % 3)  # nearly every key shares its hash with others


@pytest.mark.parametrize("colliding", [False, True])
def test_seen_keys_answer_as_a_dict_of_key_to_first_stem(colliding):
    rng = random.Random(0)
    seen, want, want_earlier = SeenKeys(_Colliding(1) if colliding else None), {}, {}
    for stem in ("a", "b", "c"):
        seen.stem = stem
        for _ in range(300):
            key = f"k{rng.randrange(400)}" if rng.random() < 0.9 else rng.randrange(5)  # a few keys not text
            where = want.get(key)
            if where is not None and where != stem:
                want_earlier.setdefault(stem, set()).add(key)
            assert (key in seen) == (where is not None), key
            if where is None:
                seen.add(key)
                want[key] = stem
    assert seen.earlier == want_earlier
    seen.clear()
    assert "k1" not in seen and seen.earlier == want_earlier


@pytest.mark.parametrize("cls", [KeyMap, _Colliding])
def test_key_maps_answer_as_dicts(cls):
    rng = random.Random(2)
    got, want = cls(3), {}
    for _ in range(2000):
        key = f"h{rng.randrange(300)}" if rng.random() < 0.95 else rng.randrange(3)
        value = (rng.randrange(5), rng.randrange(9), rng.randrange(1 << 40))
        op = rng.random()
        if op < 0.4:
            assert got.setdefault(key, value) == want.setdefault(key, value)
        elif op < 0.6:
            got[key] = want[key] = value  # a later value wins
        else:
            assert got.get(key) == want.get(key) and (key in got) == (key in want)
    assert len(got) == len(want) and all(got[k] == v for k, v in want.items())
    with pytest.raises(KeyError):
        got["absent"]


def test_a_key_map_loaded_in_another_process_hashes_its_keys_there(tmp_path):
    keys = KeyMap(3)
    for i in range(3 * KeyMap.BUFFER // 2):  # most of them moved out of the dict
        keys[f"hash-{i}"] = (i % 7, i % 11, i)
    (tmp_path / "map.pickle").write_bytes(pickle.dumps(keys))
    code = (f"import pickle; m = pickle.load(open({str(tmp_path / 'map.pickle')!r}, 'rb')); "
            f"print(m['hash-5'], m.get('hash-{KeyMap.BUFFER + 3}'), 'hash-x' in m, len(m))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "random"}, cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.split() == ["(5,", "5,", "5)", f"({(KeyMap.BUFFER + 3) % 7},", f"{(KeyMap.BUFFER + 3) % 11},",
                                  f"{KeyMap.BUFFER + 3})", "False", str(3 * KeyMap.BUFFER // 2)]


def test_row_lengths_and_prefix_digests_find_what_was_added():
    lengths = RowLengths.of({7: (3, 5), 2: (4,), 40: ()})
    assert lengths.get(2) == (4,) and lengths.get(7) == (3, 5) and lengths.get(40) == () and lengths.get(8) == ()
    assert 7 in lengths and 8 not in lengths and len(lengths) == 3
    with pytest.raises(AssertionError):
        RowLengths([3, 2], [(1,), (2,)])  # rows must ascend
    d, e = PrefixDigests(), PrefixDigests()
    d.add(1, -4, b"a" * 16)
    d.add(1, 9, b"b" * 16)
    e.add(5, 9, b"c" * 16)
    e.no_input.add(5)
    d.extend(e)
    assert d[(1, -4)] == b"a" * 16 and d[(1, 9)] == b"b" * 16 and d[(5, 9)] == b"c" * 16
    assert d.has_input(1) and not d.has_input(5) and d.has_input(99)
    with pytest.raises(KeyError):
        d[(1, 4)]


def test_earlier_turns_are_the_first_row_of_each_turn_before_a_restore():
    rng = random.Random(1)
    turns, links, first, want = _Turns(), _Turns(), {}, {}
    rows = []
    for k in range(400):
        session = rng.randrange(20)
        turn = rng.choice([0, 1, 2, 3, 4, None, "x", 2.0, True])
        cached = rng.choice([0, 0, 16, 32])
        rows.append((k, session, turn, cached))
        turns.add(session, turn, k)
        first.setdefault((session, turn), k)
        if isinstance(turn, int) and turn > 0 and cached > 0:
            links.add(session, turn, k, cached)
    for _k, session, turn, cached in rows:
        if isinstance(turn, int) and turn > 0 and cached > 0:
            for t in range(turn):
                j = first.get((session, t))
                if j is not None:
                    want.setdefault(j, set()).add(cached)
    got = turns.earlier_turns(links)
    assert {row: set(got.get(row)) for row in got.rows} == want


def test_token_facts_columns_answer_per_key():
    fact = WindowFact(128, np.array([0.5, 0.25], np.float32))
    facts = TokenFacts()
    facts.add("a", 0.125, 3, fact)
    facts.add("b", None, None, "probe failed")
    other = TokenFacts()
    other.add("c", 0.0, 0)
    facts.extend(other)
    keys = ["c", "zz", "a", "b"]
    assert facts.first_drifts(keys) == [0.0, None, 0.125, None]
    assert facts.first_drifts(pd.Series([*keys, None], dtype="str")) == [0.0, None, 0.125, None, None]  # Arrow text
    assert facts.first_drifts(pd.Series(keys, dtype=object)) == [0.0, None, 0.125, None]
    assert facts.accepted(keys) == [0, None, 3, None]
    windows = facts.windows(keys)
    assert windows[0] is None and windows[1] is None and windows[3] == "probe failed"
    assert windows[2].start == 128 and windows[2].diffs.tolist() == [0.5, 0.25]
    assert list(facts.probed(facts.rows(keys))) == [False, False, True, True]
    same = TokenFacts.from_maps({"a": 0.125}, {"a": 3, "b": None}, {"a": fact, "b": "probe failed"})
    same.add("c", 0.0, 0)
    assert facts == same and facts.by_key()["accepted"] == {"a": 3, "b": None, "c": 0}
    same.add("d", None, None)
    assert facts != same  # another candidate
    assert TokenFacts.from_maps({"a": 0.125}) != TokenFacts.from_maps({"a": 0.25})


def test_token_facts_hold_a_frames_key_column_as_it_is():
    facts = TokenFacts()
    for i in range(5):
        facts.add(f"k{i}", float(i), i)
    column = pd.Series([f"k{i}" for i in range(5)], dtype="str")
    assert not facts.share_keys(pd.Series(["k0", "k1", "k2", "k3", "x"], dtype="str"))  # not its keys
    assert not facts.share_keys(column.astype(object))  # not Arrow text
    assert not facts.share_keys(column[:4])
    assert facts.share_keys(column)
    data = column.array.__arrow_array__()
    assert facts._chunks[-1].buffers()[2].address == data.chunk(0).buffers()[2].address  # the column's own bytes
    facts.add("k5", 5.0, None)
    facts.add("k6", None, 6)
    assert facts.share_keys(pd.Series(["k5", "k6"], dtype="str"))  # only the keys added since
    assert not facts.share_keys(pd.Series(["k5", "k6"], dtype="str"))  # none added since
    keys = [f"k{i}" for i in (6, 0, 9, 3, 5)]
    assert facts.first_drifts(keys) == [None, 0.0, None, 3.0, 5.0]
    assert facts.accepted(pd.Series(keys, dtype="str")) == [6, 0, None, 3, None]
    expected = TokenFacts()
    for i in range(7):
        expected.add(f"k{i}", None if i == 6 else float(i), None if i == 5 else i)
    assert facts == expected and facts.keys() == [f"k{i}" for i in range(7)]
    with_pending = TokenFacts()
    with_pending.add("a", None, None)
    with_pending.extend(facts)  # rows after another's: only its own are ever shared
    assert with_pending.rows(["k6", "a"]).tolist() == [7, 0]
