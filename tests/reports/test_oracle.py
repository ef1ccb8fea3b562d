"""The log-prob oracle (DESIGN.md 3.3): drift over the common prefix, the five classes, onset attribution."""

from __future__ import annotations

import pandas as pd
import pytest

from reports.analyze import analyze, onset_points_at, pool_variant
from reports.oracle import DRIFT_TOLERANCE, classify, logprob_drift, position_drift
from tests.reports.factory import candidate, pair, prompt, reference

OUT = [65, 66, 67, 68, 69, 70, 71, 72]


def drifted(rec: dict, shifts: dict[int, float]) -> dict:
    """`rec` with the chosen token's log-prob (and its top-k entry) moved by `shifts[position]`."""
    rec["output_logprobs"] = [lp + shifts.get(i, 0.0) for i, lp in enumerate(rec["output_logprobs"])]
    rec["output_top_logprobs"] = [[[e[0] + shifts.get(i, 0.0), e[1]] if e[1] == rec["output_ids"][i] else e
                                   for e in top] for i, top in enumerate(rec["output_top_logprobs"])]
    return rec


def rows(records: list[dict], **kw) -> pd.DataFrame:
    cands = [r for r in records if r["role"] == "candidate"]
    refs = {r["input_hash"]: r for r in records if r["role"] == "reference"}
    return analyze(cands, refs, **kw).set_index("key", drop=False)


def one(records: list[dict], **kw) -> dict:
    (row,) = rows(records, **kw).to_dict("records")
    return row


# ---- drift ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("c_lp, r_lp, c_top, r_top, expected", [
    (-0.5, -0.5, None, None, 0.0),
    (-0.5, -0.25, None, None, 0.25),
    (-0.5, -0.5, [[-0.5, 1], [-2.0, 2]], [[-0.5, 1], [-1.0, 2]], 1.0),  # the runner-up moved
    (-0.5, -0.5, [[-0.5, 1], [-2.0, 3]], [[-0.5, 1], [-1.0, 2]], 0.0),  # token 2/3: not both returned
    (None, -0.5, [[-0.5, 1]], [[-0.75, 1]], 0.25),  # chosen log-prob missing: the top-k still counts
    (None, None, None, None, None),
])
def test_position_drift_takes_the_chosen_token_and_shared_top_k(c_lp, r_lp, c_top, r_top, expected):
    assert position_drift(c_lp, r_lp, c_top, r_top) == expected


def test_drift_value_and_onset_over_the_common_prefix():
    p = prompt(40)
    cand, ref = drifted(candidate(p, OUT), {2: 1e-4, 5: 0.3, 7: 2.0}), reference(p, OUT)
    d = logprob_drift(cand, ref, upto=7)  # position 7 lies past the prefix compared
    assert (d.value, d.onset, d.compared) == (pytest.approx(0.3), 5, 7)
    assert logprob_drift(cand, ref, upto=5).onset is None  # 1e-4 is within the default tolerance
    assert logprob_drift(cand, ref, upto=5, tolerance=1e-5).onset == 2


def test_drift_is_unmeasured_without_candidate_logprobs():
    p = prompt(40)
    cand = candidate(p, OUT, output_logprobs=[], output_top_logprobs=[])
    d = logprob_drift(cand, reference(p, OUT), upto=len(OUT))
    assert (d.value, d.onset, d.measured) == (None, None, False)


# ---- classes --------------------------------------------------------------------------------------------

def test_same_tokens_within_tolerance_is_exact():
    p = prompt(40)
    c = classify(drifted(candidate(p, OUT), {3: DRIFT_TOLERANCE / 2}), reference(p, OUT))
    assert (c.cls, c.drift.value, c.drift.onset, c.oracle) == ("exact", pytest.approx(5e-4), None, "logprob")


def test_same_tokens_beyond_tolerance_is_drift():
    p = prompt(40)
    c = classify(drifted(candidate(p, OUT), {0: 0.05, 4: 0.2}), reference(p, OUT))
    assert (c.cls, c.drift.onset, c.first_divergence) == ("drift", 0, None)
    assert c.detail == "log-prob drift 0.2 from output 0 > tolerance 0.001"
    assert classify(drifted(candidate(p, OUT), {0: 0.05}), reference(p, OUT), tolerance=0.1).cls == "exact"


def flipped(cand: dict, p: int, top: list) -> dict:
    """`cand` whose token at output p is top[0]'s, with that top-k there."""
    cand["output_ids"][p] = top[0][1]
    cand["output_logprobs"][p] = top[0][0]
    cand["output_top_logprobs"][p] = top
    return cand


def test_a_low_margin_flip_after_drift_is_hard():
    p = prompt(40)
    cand = drifted(candidate(p, list(OUT)), {1: 0.04})
    cand = flipped(cand, 5, [[-0.2502, 32], [-0.2503, 70]])  # a numerics-sized swap at the flip itself
    c = classify(cand, reference(p, OUT, margins={5: 4e-4}))
    assert (c.cls, c.first_divergence, c.drift.onset, c.ref_margin) == ("hard", 5, 1, pytest.approx(4e-4))
    assert c.detail == "log-prob drift 0.04 from output 1 before the flip at 5"


def test_a_low_margin_flip_without_drift_is_soft():
    p = prompt(40)
    # reference at 5: token 70 at -0.25, runner-up 32 at -0.2504; the candidate swapped them by numerics
    cand = flipped(drifted(candidate(p, list(OUT)), {6: 3.0}), 5, [[-0.2502, 32], [-0.2503, 70]])
    c = classify(cand, reference(p, OUT, margins={5: 4e-4}))
    assert (c.cls, c.detail) == ("soft", "margin 0.0004 < 0.5")  # drift after the flip is not looked at
    assert (c.drift.value, c.drift.onset, c.drift.compared) == (pytest.approx(3e-4), None, 6)


def test_a_flip_whose_distribution_moved_is_hard_even_at_output_zero():
    """A stale state that flips the very first token: no prefix to drift over, but the top-k entries both sides
    returned at the flip moved far more than numerics can, whatever the reference's margin."""
    p = prompt(40)
    cand = flipped(candidate(p, list(OUT)), 0, [[-0.1, 32], [-0.6, 65]])
    c = classify(cand, reference(p, OUT, margins={0: 0.3}))
    assert (c.cls, c.first_divergence, c.drift.onset, c.ref_margin) == ("hard", 0, 0, pytest.approx(0.3))
    assert c.detail == "log-prob drift 0.45 from output 0 at the flip"
    assert c.drift.value == pytest.approx(0.45) and c.drift.compared == 1


@pytest.mark.parametrize("shifts, flip_top, expected_before, expected_value", [
    ({}, None, 0.0, 0.0),  # same tokens, no drift
    ({1: 0.02, 3: 0.05}, None, 0.05, 0.05),  # same tokens: the whole turn is before any flip
    ({1: 0.02}, [[-0.1, 32], [-0.6, 69]], 0.02, 0.35),  # the flip's own top-k moved 0.35: not before it
    ({}, [[-0.1, 90], [-0.6, 91]], 0.0, 0.0),  # disjoint top-k at the flip: nothing to compare there
])
def test_drift_before_the_flip_leaves_the_flips_own_top_k_out(shifts, flip_top, expected_before, expected_value):
    """What a path's numerics moved before a flip (reports/numerics.py weighs a flip's margin against it) never
    counts the flip's own distribution: a wrong state that moves it would explain itself."""
    p = prompt(40)
    cand = drifted(candidate(p, list(OUT)), shifts)
    if flip_top is not None:
        cand = flipped(cand, 4, flip_top)
    ref = reference(p, OUT, margins={4: 0.1} if flip_top is not None else None)
    c = classify(cand, ref)
    assert (c.drift.before, c.drift.value) == (pytest.approx(expected_before), pytest.approx(expected_value))
    assert one([cand, ref])["drift_before_flip"] == pytest.approx(expected_before)


def test_without_candidate_logprobs_the_margin_rule_decides_and_says_so():
    p = prompt(40)
    bare = {"output_logprobs": [], "output_top_logprobs": []}
    c = classify(candidate(p, OUT[:5] + [120] + OUT[6:], **bare), reference(p, OUT, margins={5: 0.125}))
    assert (c.cls, c.oracle) == ("soft", "margin")
    assert c.detail == "margin 0.125 < 0.5 (no log-probs on both sides: margin rule only)"
    exact = classify(candidate(p, OUT, **bare), reference(p, OUT))
    assert (exact.cls, exact.oracle, exact.detail) == ("exact", "margin",
                                                       "no log-probs on both sides: margin rule only")


# ---- analyzer columns and onset attribution -------------------------------------------------------------

def test_requests_frame_has_drift_onset_and_its_boundary_offset():
    p = prompt(250)
    row = one([drifted(candidate(p, OUT, cached_tokens=128, interval=128, pool="i128"), {3: 0.5}),
               reference(p, OUT)])
    assert (row["class"], row["oracle"], row["drift"], row["drift_onset"]) == ("drift", "logprob", 0.5, 3)
    assert (row["drift_onset_pos"], row["drift_onset_offset"], row["drift_compared"]) == (253, -3, 8)
    assert row["onset_points_at"] == "decode"
    assert pd.isna(row["first_divergence"])


@pytest.mark.parametrize("onset, restored, expected", [
    (0, True, "restored_checkpoint"), (0, False, "prefill"), (4, True, "decode"), (None, True, None),
])
def test_onset_points_at(onset, restored, expected):
    assert onset_points_at(onset, restored) == expected


def test_a_restore_drifting_from_output_zero_points_at_the_restored_checkpoint():
    p = prompt(300)
    row = one([drifted(candidate(p, OUT, cached_tokens=256), {0: 0.8, 1: 0.9}), reference(p, OUT)])
    assert (row["class"], row["onset_points_at"], row["restored_offset"]) == ("drift", "restored_checkpoint", 44)
    hard = one(pair(p, [1] + OUT[1:], OUT, cached_tokens=256))  # flipped at 0: no prefix to drift over
    assert (hard["class"], hard["onset_points_at"], hard["drift"]) == ("hard", "restored_checkpoint", 0.0)
    exact = one(pair(p, OUT, cached_tokens=256))
    assert pd.isna(exact["onset_points_at"]) and exact["drift"] == 0.0


@pytest.mark.parametrize("speculative, radix, variant", [
    (True, True, "full"), (True, False, "spec_only"), (False, True, "cache_only"), (False, False, "cold"),
    (None, None, "full"),
])
def test_pool_variant_from_the_engine_record(speculative, radix, variant):
    engine = {} if speculative is None else {"speculative": speculative, "radix_cache": radix}
    assert pool_variant(engine) == variant


def test_tolerance_is_an_analyze_parameter():
    p = prompt(40)
    records = [drifted(candidate(p, OUT), {2: 0.01}), reference(p, OUT)]
    assert one(records)["class"] == "drift"
    assert one(records, tolerance=0.05)["class"] == "exact"


def test_a_flip_whose_top_k_lists_share_no_token_is_hard():
    """A numerics flip swaps near-tied tokens, so both sides' top-2 hold both; disjoint lists are not numerics."""
    p = prompt(40)
    cand = flipped(candidate(p, list(OUT)), 0, [[-0.2, 90], [-0.9, 91]])
    c = classify(cand, reference(p, OUT, margins={0: 0.288}))
    assert (c.cls, c.detail, c.drift.compared) == ("hard", "the top-k at the flip (output 0) share no token", 0)
