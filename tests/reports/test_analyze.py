"""Classification and attribution on hand-built records (DESIGN.md 3.3)."""

from __future__ import annotations

import pandas as pd
import pytest

from protocol.boundaries import nearest_boundary_offset
from reports.analyze import analyze, inferred_crossings, verify_crossings
from reports.crossing_cells import crossing_list
from reports.oracle import classify, first_divergence, token_rank, top_margin
from tests.reports.factory import candidate, pair, prompt, reference


def run(records: list[dict], threshold: float = 0.5) -> pd.DataFrame:
    cands = [r for r in records if r["role"] == "candidate"]
    refs = {r["input_hash"]: r for r in records if r["role"] == "reference"}
    return analyze(cands, refs, threshold=threshold).set_index("key", drop=False)


def one(records: list[dict], threshold: float = 0.5) -> dict:
    df = run(records, threshold)
    assert len(df) == 1
    return df.iloc[0].to_dict()


OUT = [65, 66, 67, 68, 69, 70, 71, 72]


# ---- pure functions -------------------------------------------------------------------------------------

@pytest.mark.parametrize("pos,interval,offset", [
    (255, 256, -1), (256, 256, 0), (257, 256, 1), (384, 256, 128), (385, 256, -127), (0, 256, 0),
    (127, 128, -1), (128, 128, 0), (129, 128, 1), (192, 128, 64), (193, 128, -63), (192, 256, -64),
])
def test_nearest_boundary_offset_is_signed_in_half_open_range(pos, interval, offset):
    assert nearest_boundary_offset(pos, interval) == offset


@pytest.mark.parametrize("cand,ref,p", [
    ([1, 2, 3], [1, 2, 3], None), ([1, 2, 3], [1, 9, 3], 1), ([9], [1], 0), ([1, 2], [1, 2, 3, 4], 2),
    ([1, 2, 3], [1, 2], 2), ([], [], None), ([], [5], 0),
])
def test_first_divergence(cand, ref, p):
    assert first_divergence(cand, ref) == p


def test_top_margin_and_rank_sort_the_top_k_first():
    top = [[-2.0, 7], [-0.5, 3], [-1.25, 9]]
    assert top_margin(top) == 0.75
    assert token_rank(top, 3) == 1
    assert token_rank(top, 9) == 2
    assert token_rank(top, 7) == 3
    assert token_rank(top, 4) is None
    assert top_margin([[-0.1, 1]]) is None
    assert top_margin(None) is None


# DESIGN.md section 1 reference table, interval 256: (pre, commit_len) -> step to track (-1: no crossing).
@pytest.mark.parametrize("pre,commit,step", [
    (255, 1, 0), (254, 2, 1), (250, 3, -1), (256, 1, -1), (250, 8, 5), (248, 8, 7), (256, 8, -1),
])
def test_verify_crossings_match_the_design_table(pre, commit, step):
    xs = verify_crossings([[pre, commit, step]], 256)
    if step == -1:
        assert xs == []
    else:
        assert len(xs) == 1
        x = xs[0]
        assert (x.boundary, x.step, x.commit_len, x.pre_len, x.source) == (256, step, commit, pre, "reported")
        assert x.tracked_agrees is True


def test_verify_crossing_untracked_by_the_engine_disagrees():
    (x,) = verify_crossings([[250, 3, -1], [253, 5, -1]], 256)
    assert (x.boundary, x.step, x.commit_len, x.tracked, x.tracked_agrees) == (256, 2, 5, -1, False)
    (y,) = verify_crossings([[126, 4, 3]], 128)  # engine tracked the wrong step
    assert (y.boundary, y.step, y.tracked_agrees) == (128, 1, False)


@pytest.mark.parametrize("input_len,n_out,interval,boundaries", [
    (250, 20, 256, [256]), (250, 20, 128, [256]), (100, 200, 128, [128, 256]), (256, 10, 256, []),
    (250, 6, 256, [256]), (250, 5, 256, []), (10, 0, 128, []),
])
def test_inferred_crossings_are_boundaries_inside_the_generated_span(input_len, n_out, interval, boundaries):
    xs = inferred_crossings(input_len, n_out, interval)
    assert [x.boundary for x in xs] == boundaries
    assert all(x.source == "inferred" and x.commit_len is None and x.step is None for x in xs)


# ---- classes --------------------------------------------------------------------------------------------

def test_exact():
    row = one(pair(prompt(100), OUT))
    assert (row["class"], row["detail"]) == ("exact", "")
    assert pd.isna(row["first_divergence"]) and pd.isna(row["divergence_offset"])


def test_soft_below_threshold():
    cand = OUT[:3] + [120] + OUT[4:]
    row = one(pair(prompt(250), cand, OUT, margins={3: 0.25}))
    assert (row["class"], row["first_divergence"], row["ref_margin"]) == ("soft", 3, 0.25)
    assert row["detail"] == "margin 0.25 < 0.5"
    assert (row["cand_token"], row["ref_token"], row["divergence_pos"]) == (120, 68, 253)


def test_margin_exactly_at_threshold_is_hard():
    cand = OUT[:3] + [120] + OUT[4:]
    row = one(pair(prompt(250), cand, OUT, margins={3: 0.5}))
    assert (row["class"], row["ref_margin"], row["detail"]) == ("hard", 0.5, "margin 0.5 >= 0.5")


def test_margin_above_threshold_is_hard_and_threshold_is_configurable():
    cand = OUT[:3] + [120] + OUT[4:]
    records = pair(prompt(250), cand, OUT, margins={3: 0.75})
    assert one(records)["class"] == "hard"
    assert one(records, threshold=1.0)["class"] == "soft"


def test_candidate_rank_in_reference_top_k():
    # the factory's reference runner-up is token 32 (space): a candidate that took it has rank 2
    row = one(pair(prompt(50), OUT[:2] + [32] + OUT[3:], OUT, margins={2: 3.0}))
    assert (row["class"], row["cand_rank"], row["ref_margin"]) == ("hard", 2, 3.0)
    row = one(pair(prompt(50), OUT[:2] + [99] + OUT[3:], OUT))
    assert pd.isna(row["cand_rank"])


def test_error_from_candidate_error():
    p = prompt(40)
    row = one([candidate(p, [], error="HTTP 500: boom"), reference(p, OUT)])
    assert (row["class"], row["detail"]) == ("error", "candidate error: HTTP 500: boom")


def test_error_from_missing_reference():
    row = one([candidate(prompt(40), OUT)])
    assert (row["class"], row["detail"]) == ("error", "no reference")


def test_error_from_reference_error():
    p = prompt(40)
    row = one([candidate(p, OUT), reference(p, [], error="timeout")])
    assert (row["class"], row["detail"]) == ("error", "reference error: timeout")


def test_length_only_divergence_is_hard():
    row = one(pair(prompt(40), OUT[:5], OUT))
    assert (row["class"], row["first_divergence"], row["detail"]) == ("hard", 5, "length: candidate 5 vs "
                                                                               "reference 8 tokens")
    row = one(pair(prompt(40), OUT + [1, 2], OUT))
    assert (row["class"], row["first_divergence"]) == ("hard", 8)
    assert row["detail"].startswith("length")


def test_classify_directly():
    p = prompt(10)
    assert classify(candidate(p, OUT), reference(p, OUT)).cls == "exact"
    assert classify(candidate(p, OUT), None).detail == "no reference"


# ---- attribution ----------------------------------------------------------------------------------------

def test_restored_checkpoint():
    row = one(pair(prompt(280), OUT, cached_tokens=256))
    assert (row["restored"], row["cached_tokens"], row["restored_offset"]) == (True, 256, 24)
    row = one(pair(prompt(280), OUT, cached_tokens=0))
    assert not row["restored"]
    assert pd.isna(row["restored_offset"])


def test_reported_crossings_with_tracked_agree_and_disagree():
    row = one(pair(prompt(250), OUT, spec_trace=[[251, 3, -1], [254, 2, 1], [256, 3, -1]]))
    assert row["crossing_source"] == "reported"
    assert (row["crossed_boundaries"], row["n_crossings"], row["n_untracked_crossings"]) == ("256", 1, 0)
    assert crossing_list(row["crossings"]) == [{"boundary": 256, "source": "reported", "pre_len": 254, "commit_len": 2,
                                               "step": 1, "tracked": 1, "tracked_agrees": True}]
    row = one(pair(prompt(250), OUT, spec_trace=[[251, 3, -1], [254, 2, -1], [256, 3, -1]]))
    assert (row["n_crossings"], row["n_untracked_crossings"]) == (1, 1)
    assert crossing_list(row["crossings"])[0]["tracked_agrees"] is False


def test_inferred_crossings_when_spec_trace_is_null():
    row = one(pair(prompt(250), list(range(65, 65 + 140)), interval=128, pool="i128"))
    assert row["crossing_source"] == "inferred"
    assert row["crossed_boundaries"] == "256 384"
    xs = crossing_list(row["crossings"])
    assert [(x["boundary"], x["commit_len"], x["step"]) for x in xs] == [(256, None, None), (384, None, None)]
    assert row["n_untracked_crossings"] == 0


@pytest.mark.parametrize("input_len,offset128,offset256", [
    (255, -1, -1), (256, 0, 0), (257, 1, 1), (192, 64, -64), (320, 64, 64), (300, 44, 44), (200, -56, -56),
])
def test_prompt_offset_sign_conventions(input_len, offset128, offset256):
    a = one(pair(prompt(input_len), OUT, interval=128, pool="i128"))
    b = one(pair(prompt(input_len), OUT, interval=256, pool="i256"))
    assert (a["prompt_offset"], b["prompt_offset"]) == (offset128, offset256)


def test_divergence_offset_is_relative_to_the_nearest_boundary():
    ref = list(range(65, 85))
    late = ref[:7] + [1] + ref[8:]  # diverges at output 7 = sequence 257
    early = ref[:3] + [1] + ref[4:]  # output 3 = sequence 253
    row = one(pair(prompt(250), late, ref))
    assert (row["first_divergence"], row["divergence_pos"], row["divergence_offset"]) == (7, 257, 1)
    row = one(pair(prompt(250), early, ref, interval=128, pool="i128"))
    assert (row["divergence_pos"], row["divergence_offset"]) == (253, -3)


def two_turns(turn0_trace, cached, *, conc0=1, conc1=1, turn1_diverges=True) -> pd.DataFrame:
    """Turn 0 from a 250-token prompt, turn 1 restoring `cached` tokens."""
    p0 = prompt(250)
    out0 = list(range(65, 81))
    p1 = p0 + out0 + prompt(10, 5)
    ref1 = [70] * 8
    cand1 = [71] * 8 if turn1_diverges else ref1
    return run(pair(p0, out0, session_id="s", turn=0, spec_trace=turn0_trace, concurrency=conc0)
               + pair(p1, cand1, ref1, session_id="s", turn=1, cached_tokens=cached, spec_trace=[],
                      concurrency=conc1))


def test_restored_verify_crossed_links_turn_to_previous_turns_verify_crossing():
    df = two_turns([[251, 3, -1], [254, 3, -1], [257, 3, -1]], cached=256)
    t0, t1 = df.loc["i256-c1/s/0"], df.loc["i256-c1/s/1"]
    assert not t0["restored_verify_crossed"]
    assert t1["restored_verify_crossed"]
    assert (t1["class"], t1["restored_crossing_step"], t1["restored_crossing_commit_len"]) == ("hard", 1, 3)
    assert not t1["restored_crossing_tracked"] and not pd.isna(t1["restored_crossing_tracked"])


@pytest.mark.parametrize("trace,cached,conc1", [
    ([[251, 3, -1], [254, 3, -1]], 128, 1),  # restored a checkpoint turn 0 never crossed
    ([[257, 3, -1], [260, 3, -1]], 256, 1),  # turn 0 crossed 256 in prefill, not in a verify step
    (None, 256, 1),  # engine without spec_trace: crossing only inferred
    ([[251, 3, -1], [254, 3, -1]], 256, 4),  # turn 1 of another sweep point (concurrency 4)
    ([[251, 3, -1], [254, 3, -1]], 0, 1),  # nothing restored
])
def test_restored_verify_crossed_false_cases(trace, cached, conc1):
    df = two_turns(trace, cached, conc1=conc1)
    assert not df["restored_verify_crossed"].any()


def test_open_loop_points_link_each_turn_to_its_own_points_previous_turn():
    """Two --request-rate points: every record has concurrency None, the keys tell the points apart. Turn 0 of
    r1 crossed 256 in a verify step, r2's turn 0 did not; each point's turn 1 restores 256."""
    p0, out0 = prompt(250), list(range(65, 81))
    p1 = p0 + out0 + prompt(10, 5)
    recs = []
    for point, trace in (("r1", [[251, 3, -1], [254, 3, -1]]), ("r2", [[257, 3, -1], [260, 3, -1]])):
        recs += pair(p0, out0, session_id="s", turn=0, spec_trace=trace, concurrency=None,
                     key=f"i256-{point}/s/0")
        recs += pair(p1, [70] * 8, session_id="s", turn=1, cached_tokens=256, spec_trace=[], concurrency=None,
                     key=f"i256-{point}/s/1")
    df = run(recs)
    assert df.loc["i256-r1/s/1", "restored_link"] == "verify" and df.loc["i256-r1/s/1", "restored_verify_crossed"]
    assert df.loc["i256-r2/s/1", "restored_link"] == "none" and not df.loc["i256-r2/s/1", "restored_verify_crossed"]


def test_analyze_empty_input_has_every_column():
    df = analyze([], {})
    assert len(df) == 0 and "restored_verify_crossed" in df.columns


@pytest.mark.parametrize("trace,cached,conc1,link", [
    ([[251, 3, -1], [254, 3, -1]], 256, 1, "verify"),  # turn 0's reported verify step crossed 256
    (None, 256, 1, "position"),  # no spec_trace: turn 0's outputs 250..265 cover 256, the step is unknown
    (None, 192, 1, "prefill"),  # 192 lies inside turn 0's 250-token prompt: a checkpoint its prefill took
    ([[251, 3, -1], [254, 3, -1]], 192, 1, "prefill"),  # the same with reported verify steps
    ([[257, 3, -1], [260, 3, -1]], 256, 1, "none"),  # reported steps, none crossed 256
    (None, 256, 4, None),  # no turn 0 at that sweep point
    (None, 0, 1, None),  # nothing restored
])
def test_restored_link_by_verify_step_or_by_position(trace, cached, conc1, link):
    df = two_turns(trace, cached, conc1=conc1)
    t1 = df[df["turn"] == 1].iloc[0]
    assert (None if pd.isna(t1["restored_link"]) else t1["restored_link"]) == link
    assert bool(t1["restored_verify_crossed"]) == (link == "verify")


def test_no_link_is_claimed_when_the_previous_turn_errored():
    from reports.links import link_restored_checkpoints

    base = dict(pool="i128", concurrency=1, session_id="s", interval=128, restored_link=None,
                restored_verify_crossed=False, crossings=[])
    rows = [{**base, "turn": 0, "class": "error", "cached_tokens": 0, "input_len": 120},
            {**base, "turn": 1, "class": "hard", "cached_tokens": 128, "input_len": 150}]

    def link():
        cols = {c: [r[c] for r in rows] for c in rows[0]}
        link_restored_checkpoints(cols, lambda i, j, length: True)
        return cols["restored_link"][1]

    assert link() is None  # turn 0 may have crossed 128 before its stream broke: unknown
    rows[0]["class"] = "exact"
    assert link() == "none"  # turn 0 is known, and it neither crossed nor prefilled 128


def test_prefill_restores_are_a_boundary_kind_with_their_offset_from_the_interval_grid():
    from reports.results import attribution_text
    from reports.tables import boundaries_table

    df = two_turns(None, 192)
    b = boundaries_table(df)
    rp = b[b["boundary_kind"] == "restored_prefill"]
    assert list(zip(rp["offset"], rp["requests"], rp["hard"], strict=True)) == [(-64, 1, 1)]  # 192 = 256 - 64
    assert not {"restored_verify", "restored_position"} & set(b["boundary_kind"])
    text = attribution_text(df[df["turn"] == 1].iloc[0].to_dict())
    assert "a checkpoint turn 0's prefill took (64-token grid)" in text


def test_position_linked_restores_are_a_boundary_kind_and_their_text_says_unknown():
    from reports.plots import _restored_empty
    from reports.results import attribution_text
    from reports.tables import boundaries_table

    df = two_turns(None, 256)
    b = boundaries_table(df)
    rp = b[b["boundary_kind"] == "restored_position"]
    assert len(rp) == 1 and int(rp["requests"].iloc[0]) == 1 and int(rp["hard"].iloc[0]) == 1
    assert "restored_verify" not in set(b["boundary_kind"])
    text = attribution_text(df[df["turn"] == 1].iloc[0].to_dict())
    assert "a checkpoint turn 0 crossed (position-linked; which verify step: unknown" in text
    assert _restored_empty(reported=False, unreported=True, linked=1).startswith("unknown: verify steps not reported")
    assert _restored_empty(reported=True, unreported=False, linked=0).startswith("no restored checkpoint was crossed")


def test_a_branch_turn_is_linked_to_the_turn_that_crossed_its_checkpoint():
    """Turns 2 and 3 branch off their history (workloads/README.md, `branch_at`) and restore the checkpoint turn 1
    restored: the crossing that took it is turn 0's. A turn that branched off below it restored another path's."""
    p0, out0 = prompt(250), list(range(65, 81))  # turn 0 crosses 256 in its second verify step
    p1 = p0 + out0 + prompt(10, 5)
    p2 = p1[:262] + prompt(12, 7)  # branches off turn 1's history at 262, past the checkpoint at 256
    p3 = p0[:200] + prompt(70, 9)  # branches off below 256: a checkpoint at 256 there is another path's
    out = [70] * 8
    df = run(pair(p0, out0, session_id="s", turn=0, spec_trace=[[251, 3, -1], [254, 3, -1], [257, 3, -1]])
             + pair(p1, out, session_id="s", turn=1, cached_tokens=256, spec_trace=[])
             + pair(p2, out, session_id="s", turn=2, cached_tokens=256, spec_trace=[])
             + pair(p2 + out + prompt(4, 8), out, session_id="s", turn=3, cached_tokens=256, spec_trace=[])
             + pair(p3, out, session_id="s", turn=4, cached_tokens=256, spec_trace=[]))
    links = {k: (df.loc[k, "restored_link"], bool(df.loc[k, "restored_verify_crossed"]))
             for k in (f"i256-c1/s/{n}" for n in (1, 2, 3, 4))}
    assert links == {"i256-c1/s/1": ("verify", True), "i256-c1/s/2": ("verify", True),
                     "i256-c1/s/3": ("verify", True), "i256-c1/s/4": ("none", False)}
    assert df.loc["i256-c1/s/2", "restored_crossing_step"] == 1


@pytest.mark.parametrize("turn,probe,expected", [
    (True, None, True), (False, True, True), (True, False, True), (False, False, False), (False, None, False),
    (None, None, None),
])
def test_injected_fault_hit_is_the_turns_or_its_window_probes(turn, probe, expected):
    extra = {} if probe is None else {"window_fault_hit": probe}
    row = one(pair(prompt(100), OUT, injected_fault_hit=turn, **extra))
    assert (None if pd.isna(row["injected_fault_hit"]) else bool(row["injected_fault_hit"])) is expected
