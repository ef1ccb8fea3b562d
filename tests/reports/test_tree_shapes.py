"""Tree shapes from records (reports/tree_shapes.py): the token trie, each request's shape, the per-interval table."""

from __future__ import annotations

import pandas as pd
import pytest

from reports.tree_shapes import SHAPE_COLUMNS, TokenTrie, request_shapes, shapes_table
from tests.reports.factory import candidate, prompt


def test_trie_says_where_a_query_leaves_the_sequences_and_where_they_part():
    t = TokenTrie()
    a = prompt(20, 1)
    t.insert(a)
    t.insert(a[:12] + prompt(6, 2))  # parts from `a` at 12
    assert t.walk(a[:8] + prompt(4, 3)) == (8, [], True)  # leaves both inside their shared edge
    assert t.walk(a[:12] + prompt(4, 4)) == (12, [12], True)  # ends at the node the split made
    assert t.walk(a[:15] + prompt(4, 5)) == (15, [12], True)  # through it, into `a`'s edge
    assert t.walk(a + prompt(4, 6)) == (12, [12], False)  # continues `a` past its end: leaves the other at 12
    assert t.walk(prompt(5, 9)) == (0, [], True)  # shares nothing
    t.insert(a[:12] + prompt(6, 2) + prompt(3, 7))  # extends the second sequence: not a new split
    assert t.walk(a[:12] + prompt(4, 4)) == (12, [12], True)


# A fan session (turn 0; turn 1 continues; turns 2 and 3 branch at 52) and a sibling whose turn 1 restores
# the fan's checkpoint at 32, as workloads/tree.py lays them out (smaller).
P = prompt(40, 1)
O0, O1, O2 = [60] * 8, [61] * 4, [62] * 4
S1, X2, X3 = prompt(16, 2), list(range(80, 92)), list(range(40, 52))  # the branches differ from their first token
SEQ1 = P + O0 + S1  # turn 1's input (64 tokens)
DESIGN = {"fan": [[], ["checkpoint"], ["deeper"], ["split"]], "sib": [[], ["checkpoint", "sibling"]]}


def _rec(session, turn, ids, out, cached, t_start, e2e=1.0, **kw):
    return candidate(ids, out, session_id=session, turn=turn, cached_tokens=cached, t_start=t_start, e2e=e2e,
                     case={"tree_shapes": DESIGN[session]}, **kw)


def _fan(t3_start=7.0):
    return [_rec("fan", 0, P, O0, 0, 0.0), _rec("fan", 1, SEQ1, O1, 32, 2.0),
            _rec("fan", 2, SEQ1[:52] + X2, O2, 32, 4.0), _rec("fan", 3, SEQ1[:52] + X3, O2, 32, t3_start)]


def _sib():
    return [_rec("sib", 0, P[:10] + prompt(30, 5), [63] * 4, 0, 0.5),
            _rec("sib", 1, P[:32] + prompt(8, 6), [64] * 4, 32, 9.0)]


def _by_key(recs) -> dict:
    rows = request_shapes(recs).to_dict("records")
    return {r["key"]: {**r, "shape": None if pd.isna(r["shape"]) else r["shape"]} for r in rows}


def test_each_turn_reaches_its_designed_shape():
    got = _by_key(_fan() + _sib())
    shapes = {k.split("/", 1)[1]: (r["shape"], r["sibling"], r["branch"]) for k, r in got.items()}
    assert shapes == {
        "fan/0": (None, False, 0),
        "fan/1": ("checkpoint", False, 10),  # continues turn 0; leaves only the sibling's turn 0, at 10
        "fan/2": ("deeper", False, 52),  # leaves turn 1's sequence at 52, past checkpoint 32, no split there
        "fan/3": ("split", False, 52),  # ends where turn 1 and turn 2 part
        "sib/0": (None, False, 0),  # sent before the fan's turn 0 finished: nothing to share yet
        "sib/1": ("checkpoint", True, 32),  # the fan's checkpoint at 32: its own turn 0 had only 10 tokens of it
    }
    assert got["i256-c1/fan/3"]["designed"] == ["split"]


def test_only_requests_that_finished_before_it_count():
    # turn 3 sent while turn 2 still runs (2 started at 4.0 and ends at 5.0): no split is known yet
    got = _by_key(_fan(t3_start=4.5))
    assert (got["i256-c1/fan/3"]["shape"], got["i256-c1/fan/3"]["branch"]) == ("deeper", 52)


def test_other_replicas_and_sweep_points_are_apart():
    recs = _fan()
    recs[2]["replica_id"] = "i256-r1"  # turn 2 on another replica: its branch is not in turn 3's tree
    assert _by_key(recs)["i256-c1/fan/3"]["shape"] == "deeper"
    other = [dict(r, concurrency=4, key=r["key"].replace("-c1/", "-c4/")) for r in _fan()]
    got = _by_key(_fan() + other)
    assert got["i256-c1/fan/3"]["shape"] == got["i256-c4/fan/3"]["shape"] == "split"


def test_failed_requests_are_neither_shaped_nor_in_the_tree():
    recs = _fan()
    recs[2]["error"] = "replica failure"
    got = _by_key(recs)
    assert "i256-c1/fan/2" not in got and got["i256-c1/fan/3"]["shape"] == "deeper"


@pytest.fixture
def table() -> pd.DataFrame:
    recs = _fan() + _sib()
    classes = pd.DataFrame({"key": [r["key"] for r in recs], "class": ["exact"] * len(recs)})
    classes.loc[classes["key"] == "i256-c1/fan/3", "class"] = "drift"
    return shapes_table(request_shapes(recs), classes)


def test_table_counts_shapes_flagged_and_design(table):
    assert list(table.columns) == SHAPE_COLUMNS
    rows = {r["shape"]: (r["requests"], r["flagged"], r["designed"], r["designed_reached"], r["by_concurrency"])
            for r in table.to_dict("records")}
    assert rows == {"checkpoint": (2, 0, 2, 2, "1:2"), "split": (1, 1, 1, 1, "1:1"), "deeper": (1, 0, 1, 1, "1:1"),
                    "sibling": (1, 0, 1, 1, "1:1")}
    assert set(table["interval"]) == {256}


def test_table_says_what_the_design_missed():
    recs = _fan(t3_start=4.5)  # turn 3 raced turn 2: designed `split`, reached `deeper`
    t = shapes_table(request_shapes(recs), pd.DataFrame({"key": [], "class": []}))
    split = t[t["shape"] == "split"].iloc[0]
    assert (split["requests"], split["designed"], split["designed_reached"]) == (0, 1, 0)
    assert shapes_table(request_shapes([]), pd.DataFrame()).empty


def test_a_pool_without_a_prefix_cache_has_no_design_to_miss():
    """A speculation-only control serves the same sessions with the radix cache off: it restores nothing, and its
    requests' designed shapes are not counted as missed (they were counted in every calibrated run's report)."""
    uncached = _fan(t3_start=7.0)
    for r in uncached:
        r.update(pool="ctl-i256-spec", key=r["key"].replace("i256-", "ctl-i256-spec-"), cached_tokens=0)
        r["engine"]["radix_cache"] = False
    t = shapes_table(request_shapes(_fan() + uncached), pd.DataFrame({"key": [], "class": []}))
    assert list(t["designed"]) == list(t["designed_reached"]) == [1, 1, 1, 0]  # checkpoint, split, deeper, sibling


def test_a_branch_the_request_only_continues_is_not_a_split():
    """Turn 1 continues its own turn 0, which left a stem at 30; it restored 16, so the cache held at most 16 of
    turn 0's tokens (or turn 1 would have restored more): no split at 30, the match went into the stem's edge."""
    stem, own = prompt(60, 1), prompt(20, 2)
    t0 = stem[:30] + own
    recs = [candidate(stem, [60] * 8, session_id="stem", t_start=0.0, e2e=1.0),
            candidate(t0, [61] * 4, session_id="s", turn=0, t_start=2.0, e2e=1.0),
            candidate(t0 + [61] * 4 + prompt(6, 3), [62] * 4, session_id="s", turn=1, cached_tokens=16, t_start=4.0)]
    row = _by_key(recs)["i256-c1/s/1"]
    assert (row["shape"], row["branch"], row["sibling"]) == ("deeper", 30, False)
