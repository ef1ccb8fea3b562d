"""Numerics as a hypothesis with a size (reports/numerics.py): a flip is numerics only where the path's measured
numerics can close its reference margin; otherwise it is hard and gated, whatever the pool restored."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from reports.analyze import analyze
from reports.diagnosis import diagnose
from reports.facts import TokenFacts
from reports.gate import EXIT_GATE_FAILED, GateThresholds
from reports.numerics import (
    SWAP_FACTOR,
    NumericsScale,
    decisive,
    decisive_lines,
    pool_scales,
    with_decisive_flips,
)
from reports.render import judge
from tests.reports.factory import pair, prompt


@pytest.mark.parametrize("tolerance, own, controls, control_flip, margin, explained", [
    (1e-3, None, None, None, 0.0015, True),  # fp32: a near-tie within twice the tolerance
    (1e-3, None, None, None, 0.0021, False),
    (1e-3, 7e-6, None, None, 0.125, False),  # fp32 moves log-probs by 1e-5: a 0.125 gap is not numerics
    (1e-4, 0.0, 0.0, None, 0.5, False),  # Mamba2 + n-gram on vLLM: every drift 0, margins up to 3.44
    (1e-4, 0.0, 0.0, None, 3.44, False),
    (0.234, 1.39, 0.0584, None, 2.78, True),  # Qwen3-Next bf16 spec-only: drift 1.39 closes gaps up to 2.78
    (0.234, 1.39, 0.0584, None, 2.79, False),
    (0.761, 0.165, 0.19, 0.0312, 1.52, True),  # built-in bf16: the calibrated tolerance sets the reach
    (1e-4, 0.0, 1e-5, 0.0312, 0.0624, True),  # a margin the path's controls flipped at, twice
    (1e-4, 0.0, 1e-5, 0.0312, 0.07, False),
    (1.0, 1.0, None, None, None, False),  # no margin to weigh: never numerics
    (1.0, 1.0, None, None, math.nan, False),
])
def test_a_flip_is_numerics_only_within_twice_the_paths_reach(tolerance, own, controls, control_flip, margin,
                                                             explained):
    scale = NumericsScale("p", tolerance, own, controls, control_flip)
    assert scale.reach == max(v for v in (tolerance, own, controls, control_flip) if v is not None)
    assert scale.limit == SWAP_FACTOR * scale.reach
    assert scale.explains(margin) is explained


def _rows(rows: list[dict]) -> pd.DataFrame:
    base = {"pool": "p", "class": "exact", "restored": False, "drift_before_flip": 0.0, "first_divergence": None,
            "ref_margin": None, "cand_token": None, "ref_token": None, "detail": ""}
    return pd.DataFrame([{**base, **r} for r in rows])


def test_the_pools_own_reach_is_its_unrestored_turns_drift_before_any_flip():
    df = _rows([
        {"drift_before_flip": 0.2},
        {"drift_before_flip": 3.0, "restored": True},  # a restore may carry the bug: never numerics' measure
        {"drift_before_flip": 5.0, "class": "error"},
        {"pool": "q", "drift_before_flip": None},
    ])
    scales = pool_scales(df, {"p": 0.05}, 1e-3, {"p": {"drift_max": 0.01, "flip_margin_max": None},
                                                 "q": {"drift_max": "nan"}})
    assert scales == {"p": NumericsScale("p", 0.05, 0.2, 0.01, None), "q": NumericsScale("q", 1e-3, None, None, None)}
    assert scales["p"].evidence() == "its turns that restored nothing 0.2 (before any flip), its controls 0.01, its " \
                                     "tolerance 0.05"


@pytest.mark.parametrize("row, expected", [
    ({}, False),  # no flip
    ({"class": "hard", "first_divergence": 3, "ref_margin": 0.3, "cand_token": 7, "ref_token": 8}, False),
    ({"class": "hard", "first_divergence": 3, "ref_margin": 0.5, "cand_token": 7, "ref_token": 8}, True),
    ({"class": "soft", "first_divergence": 3, "ref_margin": 0.45, "cand_token": 7, "ref_token": 8}, True),
    ({"class": "hard", "first_divergence": 3, "ref_margin": None, "cand_token": 7, "ref_token": 8}, True),
    ({"class": "hard", "first_divergence": 3, "ref_margin": 0.1, "cand_token": None, "ref_token": 8}, True),
    ({"class": "hard", "first_divergence": 3, "ref_margin": 0.9, "pool": "unscaled", "cand_token": 7,
      "ref_token": 8}, False),
])
def test_decisive_flips(row, expected):
    df = _rows([row])
    assert bool(decisive(df, {"p": NumericsScale("p", 0.2)}).iloc[0]) is expected


def test_a_soft_flip_beyond_the_reach_is_hard_and_says_why():
    df = _rows([{"class": "soft", "first_divergence": 5, "ref_margin": 0.125, "cand_token": 33, "ref_token": 120,
                 "detail": "margin 0.125 < 0.5"},
                {"class": "soft", "first_divergence": 2, "ref_margin": 0.0015, "cand_token": 33, "ref_token": 120,
                 "detail": "margin 0.0015 < 0.5"}])
    scales = {"p": NumericsScale("p", 1e-3, own=7e-6)}
    out = with_decisive_flips(df, scales)
    assert list(out["class"]) == ["hard", "soft"]
    assert out["detail"].iloc[0] == ("margin 0.125 > 2 x 0.001, the most this path's numerics move a log-prob (its "
                                     "turns that restored nothing 7e-06 (before any flip), its tolerance 0.001): not "
                                     "numerics")
    assert with_decisive_flips(out, scales).equals(out)  # idempotent
    assert decisive_lines(out, decisive(out, scales), scales) == [
        "pool p: 1 token flip(s) at output 5 that no measured numerics explain (reference margin 0.125 at the flip), "
        "where 2 x 0.001 = 0.002 is the most this path's numerics can close (its turns that restored nothing 7e-06 "
        "(before any flip), its tolerance 0.001): hard mismatches, whatever the pool restored"]


def _mamba2_ngram_run(margins: list[float]) -> tuple[pd.DataFrame, TokenFacts]:
    """Records shaped like vLLM's CPU build serving a tiny fp32 Mamba2 with n-gram speculation and no prefix cache
    (`--no-enable-prefix-caching`): the prefill's token agrees exactly, then every request flips at its first
    verify step (output 1), its top-2 sharing no token with the reference's (or, every third, sharing one that
    moved by 1.2); the calibration's clean baseline drifts by 0 and never flips."""
    recs = []
    out = [100 + j for j in range(6)]
    for s, margin in enumerate(margins):
        spec = pair(prompt(60 + s, seed=s), out[:1] + [40 + s] + out[2:], out, margins={1: margin}, pool="vllm",
                    interval=None, session_id=f"s{s}", spec_trace=None, accept=None)
        spec[0]["engine"]["radix_cache"] = False
        spec[0]["output_top_logprobs"][1] = ([[-0.1, 40 + s], [-1.45, out[1]]] if s % 3 == 0
                                             else [[-0.1, 40 + s], [-0.9, 90]])
        base = pair(prompt(60 + s, seed=s), out, pool="baseline", interval=None, session_id=f"b{s}", spec_trace=None,
                    accept=None)
        base[0]["engine"].update(speculative=False, radix_cache=False)
        recs += spec + base[:1]
    cands = [r for r in recs if r["role"] == "candidate"]
    refs = {r["input_hash"]: r for r in recs if r["role"] == "reference"}
    return analyze(cands, refs, per_pool={"vllm": (0.5, 1e-4), "baseline": (0.5, 1e-4)}), \
        TokenFacts.of({r["key"]: r for r in cands}, refs)


MAMBA2_CALIBRATION = {"vllm": {"controls": ["baseline"], "drift_max": 0.0, "flip_margin_max": None}}


def test_speculation_that_changes_tokens_fails_though_the_pool_restored_nothing_and_no_control_shares_its_path():
    """The speculation-only pool restored nothing and no control shares its path, which used to make every flag
    'path numerics, not judged' (INCONCLUSIVE): but margins of 0.05 to 3.44 where every drift is 0 are no
    numerics. FAIL, every request hard, the reasons say margin against reach, the diagnosis names speculation."""
    margins = [0.05, 0.3, 0.5, 1.0, 2.0, 3.44]
    df, facts = _mamba2_ngram_run(margins)
    verdict, lines, judged = judge(df, facts, GateThresholds(min_coverage=0.0), True, {"vllm": (0.5, 1e-4)},
                                   calibration=MAMBA2_CALIBRATION)
    assert (verdict.word, verdict.exit_code, verdict.hard, verdict.path_numerics) == ("FAIL", EXIT_GATE_FAILED, 6, 0)
    assert verdict.reasons == [
        "6 hard mismatches > allowed 0",
        "pool vllm: 6 token flip(s) at output 1 that no measured numerics explain (reference margin 0.05 to 3.44 at "
        "the flip), where 2 x 0.0001 = 0.0002 is the most this path's numerics can close (its turns that restored "
        "nothing 0 (before any flip), its controls 0, its tolerance 0.0001): hard mismatches, whatever the pool "
        "restored"]
    assert lines == []  # nothing left as path numerics
    assert any("no checkpoint boundary was crossed inside a verify step" in u for u in verdict.unexercised)
    gated = judged[judged["pool"] == "vllm"]
    assert list(gated["class"]) == ["hard"] * 6 and not gated["unjudged_pool"].any()
    d = diagnose(judged)
    assert d.subsystem == "speculation"
    assert d.headline == ("The evidence points at speculative verify / accept: every flagged request ran with "
                          "speculation and no prefix cache (nothing to restore), so the cache cannot be at fault "
                          "(pool(s) vllm).")


def test_flips_within_what_the_path_moved_stay_path_numerics():
    """The same pool where the path measurably moves log-probs (a drift of 2 before the flips, as vLLM's bf16
    verify forward does): flips at margins up to 3.44 <= 2 x 2 are numerics of a path no control shares: not
    judged (INCONCLUSIVE), as before."""
    df, facts = _mamba2_ngram_run([0.05, 3.44])
    df.loc[df["pool"] == "vllm", "drift_before_flip"] = 2.0
    verdict, lines, judged = judge(df, facts, GateThresholds(min_coverage=0.0), True, {"vllm": (0.5, 1e-4)},
                                   calibration=MAMBA2_CALIBRATION)
    assert (verdict.word, verdict.hard, verdict.path_numerics) == ("INCONCLUSIVE", 0, 2)
    assert lines[0].startswith("pool vllm: restored nothing, and no control shares its path")
    assert judged[judged["pool"] == "vllm"]["unjudged_pool"].all()
