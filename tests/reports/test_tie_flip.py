"""reports.oracle.tie_flip, as benchmarks/chaos.py and the Poisson test compare two runs of one suite: where the
two runs part at tokens tied within the margin in both (a retried request batched with other requests), the
outputs are not a difference; any other token difference is. chaos.py compares verdicts without their soft
count, which such a flip moves."""

import sys
from pathlib import Path

from reports.oracle import tie_flip

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from chaos import differences  # noqa: E402
from chaos_run import gated  # noqa: E402


def rec(ids: list[int], tops: list[list[list]]) -> dict:
    return {"output_ids": ids, "output_top_logprobs": tops}


# CI's failure of 2026-12-02: reference ref/b8f353ef8409e344 of the tiny random model, re-sent after its replica
# was killed, chose 105 over 215 at output 15; the two were 1e-5 apart in both runs.
CLEAN = rec([7, 215, 3], [[[-0.1, 7]], [[-0.9920332431793213, 215], [-0.9920427799224854, 105]], [[-0.2, 3]]])
CHAOS = rec([7, 105, 9], [[[-0.1, 7]], [[-0.9920340776443481, 105], [-0.9920397996902466, 215]], [[-0.3, 9]]])


def test_a_swap_of_tokens_tied_within_the_margin_in_both_runs_is_a_tie_flip():
    assert tie_flip(CLEAN, CHAOS) and tie_flip(CHAOS, CLEAN)


def test_a_swap_whose_gap_reaches_the_margin_in_either_run_is_a_difference():
    wide = rec([7, 105, 9], [[[-0.1, 7]], [[-0.5, 105], [-0.5011, 215]], [[-0.3, 9]]])
    assert not tie_flip(CLEAN, wide) and not tie_flip(wide, CLEAN)
    assert tie_flip(CLEAN, wide, margin=2e-3)


def test_a_token_outside_the_other_runs_top_k_or_a_missing_top_k_is_a_difference():
    other = rec([7, 105, 9], [[[-0.1, 7]], [[-0.99203, 105], [-0.99204, 44]], [[-0.3, 9]]])
    assert not tie_flip(CLEAN, other)
    assert not tie_flip(CLEAN, rec([7, 105, 9], []))


def test_equal_outputs_or_one_a_prefix_of_the_other_are_not_tie_flips():
    assert not tie_flip(CLEAN, CLEAN)
    assert not tie_flip(CLEAN, rec([7, 215], CLEAN["output_top_logprobs"][:2]))


def test_a_verdict_is_compared_without_its_soft_count_only():
    a = "INCONCLUSIVE: 0 hard mismatches, 0 drift (0/148 requests), 0 errors, 2 soft (1.4%)"
    b = "INCONCLUSIVE: 0 hard mismatches, 0 drift (0/148 requests), 0 errors, 0 soft (0.0%)"
    assert gated(a) == gated(b) == "INCONCLUSIVE: 0 hard mismatches, 0 drift (0/148 requests), 0 errors"
    assert gated(a.replace("0 hard", "1 hard")) != gated(b)
    assert gated(None) is None


def _session(turn0: dict, turn1_out: list[int], ref1: str) -> list[dict]:
    """A two-turn session's candidates (turn 1's input hash `ref1`) and their references."""
    t0 = {**turn0, "key": "i128-c4/s/0", "role": "candidate", "input_hash": "h0"}
    t1 = {"key": "i128-c4/s/1", "role": "candidate", "input_hash": ref1, "output_ids": turn1_out}
    refs = [{**CLEAN, "key": "ref/h0", "role": "reference", "input_hash": "h0"},
            {"key": f"ref/{ref1}", "role": "reference", "input_hash": ref1, "output_ids": [1]}]
    return [t0, t1, *refs]


def test_a_candidates_tie_flip_excuses_its_sessions_later_turns_and_their_references_only():
    clean, chaos = _session(CLEAN, [4, 4], "h1"), _session(CHAOS, [5, 5], "h1x")  # turn 1 built from another output
    d = differences(clean, chaos)
    assert d == {"outputs_differ": [], "tie_flips": ["i128-c4/s/0"], "after_tie_flip": ["i128-c4/s/1"],
                 "unmatched_refs": ["ref/h1", "ref/h1x"]}
    # without the flip at turn 0, the same later difference is a real one, and the references are not excused
    wide = rec([7, 105, 9], [[[-0.1, 7]], [[-0.5, 105], [-0.6, 215]], [[-0.3, 9]]])
    d = differences(clean, _session(wide, [5, 5], "h1x"))
    assert d == {"outputs_differ": ["i128-c4/s/0", "i128-c4/s/1"], "tie_flips": [], "after_tie_flip": [],
                 "unmatched_refs": []}
