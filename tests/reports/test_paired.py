"""The paired check (reports/paired.py): restored turns against the same request on a trusted build."""

from __future__ import annotations

import copy
import json

import pandas as pd
import pytest

from reports.paired import DETAIL, pair_drifts, paired_check
from reports.render import render_run
from tests.reports.factory import pair, prompt, write_run


def _records(concurrency: int = 1) -> list[dict]:
    """Per session: turn 0 restores nothing, turn 1 restores a checkpoint; four sessions."""
    recs = []
    for s in range(4):
        p0 = prompt(100, seed=s)
        recs += pair(p0, [100 + s] * 8, pool="i128", interval=128, concurrency=concurrency, session_id=f"s{s}")
        recs += pair(p0 + [100 + s] * 8 + prompt(20, seed=9), [110 + s] * 8, pool="i128", interval=128,
                     concurrency=concurrency, session_id=f"s{s}", turn=1, cached_tokens=128)
    return recs


def _candidate(recs: list[dict], session: str, turn: int) -> dict:
    return next(r for r in recs if r["role"] == "candidate" and r["session_id"] == session and r["turn"] == turn)


def test_a_restored_turn_that_moved_from_its_trusted_twin_is_flagged_and_an_unchanged_one_is_not(tmp_path):
    trusted = _records()
    write_run(tmp_path / "trusted", trusted)
    new = copy.deepcopy(trusted)
    _candidate(new, "s1", 1)["output_logprobs"][3] -= 0.002  # a restore that moved one output a little
    _candidate(new, "s2", 1)["output_logprobs"][0] -= 0.00005  # below the floor (1e-4 per output)
    write_run(tmp_path / "new", new)
    found = paired_check(tmp_path / "new", tmp_path / "trusted", {"i128"})
    assert (found.matched, found.judged, found.paired_points, found.moved_points) == (8, 4, ["i128-c1"], {})
    assert list(found.flagged) == ["i128-c1/s1/1"]
    assert found.flagged["i128-c1/s1/1"] == (f"{DETAIL}: pair drift summed over outputs 0-3 0.002 > 0.0004 there (its "
                                             "sweep point's turns that restored nothing equal their twins bit for "
                                             "bit)")


def test_a_sweep_point_whose_unrestored_turns_moved_is_not_paired(tmp_path):
    """Batching (concurrency 4) moved the turns that restored nothing: it moves restored turns more (their checkpoint
    was taken in a batch too), so that sweep point is left to the controls' limits; concurrency 1 is paired."""
    trusted = _records(concurrency=4) + _records(concurrency=1)
    write_run(tmp_path / "trusted", trusted)
    new = copy.deepcopy(trusted)
    c4 = [r for r in new if r["concurrency"] == 4]
    for s in range(4):
        _candidate(c4, f"s{s}", 0)["output_logprobs"] = [-0.25 - 0.01 * (j % 2) for j in range(8)]
    _candidate(c4, "s3", 1)["output_logprobs"] = [-0.25 - 0.2] * 8
    _candidate([r for r in new if r["concurrency"] == 1], "s3", 1)["output_logprobs"][5] -= 0.01
    write_run(tmp_path / "new", new)
    found = paired_check(tmp_path / "new", tmp_path / "trusted", {"i128"})
    assert found.paired_points == ["i128-c1"] and list(found.moved_points) == ["i128-c4"]
    assert found.moved_points["i128-c4"] == pytest.approx(0.01, rel=1e-6)  # log-probs are stored as float32
    assert (found.matched, found.judged, list(found.flagged)) == (16, 4, ["i128-c1/s3/1"])
    assert "not paired, their unrestored turns moved: i128-c4 (by up to 0.01 per output)" in found.text()


def test_turns_the_trusted_run_flagged_or_whose_input_changed_are_not_paired(tmp_path):
    trusted = _records()
    write_run(tmp_path / "trusted", trusted)
    pd.DataFrame({"key": ["i128-c1/s1/1"], "class": ["drift"]}).to_csv(tmp_path / "trusted" / "requests.csv")
    new = copy.deepcopy(trusted)
    _candidate(new, "s1", 1)["output_logprobs"][0] -= 0.3  # the trusted turn was wrong: it may change
    moved = _candidate(new, "s2", 1)
    moved["input_hash"] = "another-input"  # an earlier turn changed its prompt: no twin
    moved["output_logprobs"][0] -= 0.3
    write_run(tmp_path / "new", [r for r in new if r["role"] == "candidate"])
    found = paired_check(tmp_path / "new", tmp_path / "trusted", {"i128"})
    assert (found.matched, found.judged, found.skipped_trusted_flagged, found.flagged) == (7, 2, 1, {})


def test_tokens_that_leave_the_trusted_turns_are_a_move_where_unrestored_turns_never_part():
    import numpy as np

    from reports.paired import Turn

    a = Turn("p", "h", True, np.array([1, 2, 3, 4]), np.array([-0.1, -0.2, -0.3, -0.4]))
    b = Turn("p", "h", True, np.array([1, 2, 9, 4]), np.array([-0.1, -0.25, -0.3, -0.4]))
    diffs, part = pair_drifts(a, b)
    assert part == 2 and [round(d, 6) for d in diffs] == [0.0, 0.05]
    assert pair_drifts(a, a) == ([0.0] * 4, None)


def test_render_flags_the_moved_turns_of_a_run_calibrated_against_a_trusted_run(tmp_path):
    trusted = _records()
    write_run(tmp_path / "trusted", trusted)
    new = copy.deepcopy(trusted)
    _candidate(new, "s1", 1)["output_logprobs"][2] -= 0.01
    per_pool = {"i128": {"controls": ["i128"], "margin_threshold": 0.5, "drift_tolerance": 0.05, "envelope": None,
                         "restore_tolerance": None}}
    config = {"calibration": {"per_pool": per_pool, "baseline_run": str(tmp_path / "trusted"), "text": "x"},
              "min_coverage": 0.0}
    write_run(tmp_path / "new", new, config)
    verdict = render_run(tmp_path / "new")
    assert (verdict.word, verdict.drift, verdict.reasons[0][:30]) == ("FAIL", 1, "1 requests with log-prob drift")
    rows = pd.read_csv(tmp_path / "new" / "requests.csv")
    moved = rows[rows["class"] == "drift"]
    assert list(moved["key"]) == ["i128-c1/s1/1"] and moved["detail"].iloc[0].startswith(DETAIL)
    summary = (tmp_path / "new" / "summary.md").read_text()
    assert "Paired check: paired with the trusted run" in summary and "1 moved (more than 0.0001 per output" in summary
    # the trusted run gone: the check says it did not run, and the turn is judged as before (within 0.05; these
    # hand-built turns cross no boundary in a verify step, so the run is INCONCLUSIVE, not FAIL)
    (tmp_path / "new" / "config.json").write_text(json.dumps(
        {**config, "calibration": {**config["calibration"], "baseline_run": str(tmp_path / "gone")}}))
    again = render_run(tmp_path / "new")
    assert (again.word, again.drift, again.hard) == ("INCONCLUSIVE", 0, 0)
    assert "Paired check: not run: the trusted run" in (tmp_path / "new" / "summary.md").read_text()


def test_a_sweep_point_whose_unrestored_tokens_changed_is_not_paired(tmp_path):
    """A fault on every verify step (conv-rollback-wrong-step) changes turns that restored nothing too: nothing
    is paired there, and the report says the tokens parted."""
    trusted = _records()
    write_run(tmp_path / "trusted", trusted)
    new = copy.deepcopy(trusted)
    _candidate(new, "s0", 0)["output_ids"][6] = 7
    _candidate(new, "s1", 1)["output_logprobs"][0] -= 0.5
    write_run(tmp_path / "new", new)
    found = paired_check(tmp_path / "new", tmp_path / "trusted", {"i128"})
    assert (found.paired_points, found.judged, found.flagged) == ([], 0, {})
    assert "not paired, their unrestored turns moved: i128-c1 (their tokens part from their twins')" in found.text()
