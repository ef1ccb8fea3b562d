"""The restore window check (reports/window.py): a restored turn's prompt tokens past its checkpoint, candidate
against the reference, judged by the window's own limits."""

from __future__ import annotations

import numpy as np
import pandas as pd

from reports.controls import path_numerics
from reports.envelope import Envelope
from reports.facts import TokenFacts
from reports.window import (
    WindowFact,
    WindowLimits,
    unprobed_reason,
    window_diffs,
    window_fact,
    window_flag,
    window_lines,
    with_windows,
)


def probed(start=128, cand=(-1.0, -2.0, -3.0), ref=(-1.0, -2.5, -3.0), cached=None, error=None) -> dict:
    rec = {"window_start": start, "window_cached_tokens": start if cached is None else cached,
           "window_logprobs": list(cand), "window_ref_logprobs": list(ref)}
    if error:
        rec["window_error"] = error
    return rec


def test_window_diffs_compare_only_a_probe_that_restored_the_turns_checkpoint():
    assert window_diffs({"cached_tokens": 128}) is None  # no probe
    assert window_diffs(probed()) == [0.0, 0.5, 0.0]
    assert window_diffs(probed(cand=(-1.0, None, -3.5))) == [0.0, 0.0, 0.5]  # a token one side did not score
    assert window_diffs(probed(cached=64)) == ("the probe restored 64 tokens, not the turn's 128: the checkpoint "
                                               "changed in between")
    assert window_diffs(probed(error="candidate probe: HTTP 400: no")) == "probe failed: candidate probe: HTTP 400: no"
    assert window_diffs(probed(ref=(-1.0,))) == "the probe's two sides scored different token counts"
    assert window_fact(probed(cand=(None,), ref=(-1.0,))) == "no window token was scored on both sides"


def test_a_window_fact_holds_the_differences_its_largest_and_their_ladder():
    fact = window_fact(probed(cand=(-1.0, -2.0, -3.0, -4.0), ref=(-1.25, -2.0, -3.5, -4.0)))
    assert isinstance(fact, WindowFact) and fact.start == 128 and fact.n == 4
    assert fact.drift == 0.5 and fact.position(2) == 131
    assert fact.sums[:3] == (0.25, 0.75, 0.75)


def test_a_window_passes_its_tolerance_or_its_envelope_first():
    fact = window_fact(probed(cand=(-1.0, -2.0, -3.0, -4.0), ref=(-1.2, -2.2, -3.2, -4.9)))
    assert window_flag(fact, WindowLimits(1.0)) is None
    assert window_flag(fact, WindowLimits(0.5)) == (
        3, "prompt log-prob drift 0.9 at prompt token 132 (4 past the restored checkpoint 128) > window tolerance 0.5")
    env = Envelope((0.3, 0.5) + (10.0,) * 14)  # the first token alone, then the first 4
    assert window_flag(fact, WindowLimits(1.0, env)) == (
        2, "prompt log-prob drift summed over prompt tokens 129-131 past the restored checkpoint 128: 0.6 > the "
           "path's window envelope 0.5 there")
    assert window_flag(fact, WindowLimits(0.1, env))[0] == 0  # the tolerance passed first


def _frame() -> pd.DataFrame:
    return pd.DataFrame({
        "key": ["a", "b", "c", "d", "e", "f"], "pool": ["i128"] * 5 + ["ctl-i128-cache"],
        "class": ["exact", "soft", "hard", "exact", "exact", "exact"],
        "detail": [None, "margin 0.1 < 0.5", "margin 3 >= 0.5", None, None, None],
        "onset_points_at": [None, "decode", "decode", None, None, None],
        "restored": [True, True, True, True, False, True], "drift": [0.01] * 6, "drift_onset": [np.nan] * 6})


def test_with_windows_flags_restored_turns_whose_window_moved_and_says_why_others_were_not_compared():
    moved = window_fact(probed(cand=(-1.0, -2.0), ref=(-1.0, -3.0)))
    calm = window_fact(probed(cand=(-1.0, -2.0), ref=(-1.0, -2.01)))
    facts = TokenFacts.from_maps(window={"a": moved, "b": moved, "c": moved,
                                         "d": "probe failed: reference probe: HTTP 500: x", "f": moved})
    out = with_windows(_frame(), facts, {"ctl-i128-cache": WindowLimits(5.0)}, WindowLimits(0.5))
    assert list(out["class"]) == ["drift", "hard", "hard", "exact", "exact", "exact"]
    assert out["detail"][0] == ("prompt log-prob drift 1 at prompt token 130 (2 past the restored checkpoint 128) > "
                                "window tolerance 0.5")
    assert out["detail"][1] == out["detail"][0] and out["detail"][2] == "margin 3 >= 0.5"  # a hard turn keeps its own
    assert list(out["onset_points_at"])[:3] == ["restored_checkpoint"] * 3  # the window moved before any output
    assert list(out["window_status"]) == ["flagged", "flagged", "flagged",
                                          "not compared: probe failed: reference probe: HTTP 500: x", None, "compared"]
    assert list(out["window_onset_pos"]) == [130, 130, 130, None, None, None]
    assert list(out["window_drift"])[:3] == [1.0, 1.0, 1.0] and out["window_len"][0] == 2
    again = with_windows(out, facts, {"ctl-i128-cache": WindowLimits(5.0)}, WindowLimits(0.5))
    assert again.equals(out)  # idempotent
    calm_out = with_windows(_frame(), TokenFacts.from_maps(window={"a": calm}), {}, WindowLimits(0.5))
    assert calm_out["class"][0] == "exact" and calm_out["window_status"][0] == "compared"


def test_a_flagged_window_is_never_path_numerics():
    df = _frame().assign(**{"pool": ["i128"] * 6, "class": ["drift"] * 6, "drift_onset": [0.0] * 6,
                            "first_divergence": [np.nan] * 6,
                            "drift": [0.5, 0.5, 0.5, 0.5, 0.9, 0.5], "restored": [True, True, True, True, False,
                                                                                  True]})
    plain = path_numerics(df)
    assert list(plain) == [True, True, True, True, True, True]  # drift from output 0 within the unrestored turns'
    df["window_status"] = ["flagged", None, None, "compared", None, "flagged"]
    assert list(path_numerics(df)) == [False, True, True, True, True, False]


def test_window_lines_say_per_pool_what_was_compared_and_why_not():
    df = pd.DataFrame({"pool": ["i128"] * 5 + ["i256"] * 2, "restored": [True, True, True, True, False, True, False],
                       "window_status": ["flagged", "compared", "not compared: probe failed: x", None, None, None,
                                         None]})
    assert window_lines(df, "--no-restore-window") == [
        "pool i128: 2 of 4 restored turn(s) compared on their restore window, 1 past its limits; 1 not compared "
        "(probe failed: x); 1 with no window to probe (at most one prompt token past the checkpoint)",
        "pool i256: no restore window compared (1 restored turn(s) judged on their outputs alone: "
        "--no-restore-window)"]
    assert unprobed_reason({"run_config": {"no_restore_window": True}}) == "--no-restore-window"
    assert unprobed_reason({"run_config": {"engine": "vllm", "backend": "openai"}}).startswith(
        "the OpenAI protocol cannot score a prompt")
    assert unprobed_reason({"run_config": {"engine": "builtin", "backend": "openai"}}).startswith("the OpenAI")
    assert unprobed_reason({"backend": "sglang"}) == "no probe answered (or a run from before the probe)"


def test_window_columns_are_there_even_for_an_empty_frame():
    empty = with_windows(_frame().iloc[:0], TokenFacts(), {}, WindowLimits(0.5))
    assert {"window_start", "window_len", "window_drift", "window_onset_pos", "window_status"} <= set(empty)
