"""The noise floor beside the tolerance, the differential diagnosis, and the boundary-cell coverage."""

from __future__ import annotations

import pandas as pd
import pytest

from reports.analyze import analyze
from reports.coverage import cells, coverage_summary, coverage_table
from reports.diagnosis import SUBSYSTEMS, diagnose, interval_subsystem, noise_floor
from reports.exact_test import ExactTest
from reports.facts import TokenFacts
from reports.flip_rates import RateTest
from tests.reports.factory import pair, prompt

SUFFIX = {"full": "", "spec_only": "-spec", "cache_only": "-cache"}


def frame(rows: list[dict]) -> pd.DataFrame:
    base = {"class": "exact", "cached_tokens": 0, "drift": 0.0, "oracle": "logprob", "interval": 128,
            "variant": "full", "onset_points_at": None, "restored_verify_crossed": False,
            "restored_link": None, "restored": False, "error": None}
    rows = [{**base, **r} for r in rows]
    return pd.DataFrame([{"pool": f"i{r['interval']}{SUFFIX[r['variant']]}", **r} for r in rows])


def test_noise_floor_is_the_drift_of_requests_that_restored_nothing():
    df = frame([{"drift": 1e-5}, {"drift": 3e-5}, {"drift": 0.4, "cached_tokens": 128, "class": "drift"},
                {"drift": None, "oracle": "margin"}, {"class": "error", "drift": None, "oracle": None}])
    f = noise_floor(df, 1e-3)
    assert (f.requests, f.max, f.unmeasured, f.too_close) == (2, 3e-5, 1, False)
    assert f.warnings() == ["1 request(s) without log-probs on both sides: classified by the margin rule only "
                            "(drift not measured)"]


def test_a_floor_within_10x_of_the_tolerance_warns():
    f = noise_floor(frame([{"drift": 2e-4}, {"drift": 1e-6}]), 1e-3)
    assert f.too_close
    assert f.warnings()[0].startswith("the observed noise floor (max drift 0.0002 over 2 requests that restored "
                                      "nothing) is within 10x of the drift tolerance 0.001")
    assert not noise_floor(frame([{"drift": 9.9e-5}]), 1e-3).too_close
    assert noise_floor(frame([{"cached_tokens": 64}]), 1e-3).max is None


@pytest.mark.parametrize("full, spec, cache, subsystem", [
    (5, 0, 0, "interplay"), (5, 0, 3, "caching"), (0, 0, 3, "caching"), (5, 2, 0, "speculation"),
    (5, 2, 3, "both"), (0, 0, 0, "none"),
])
def test_subsystem_rule(full, spec, cache, subsystem):
    assert interval_subsystem({"full": full, "spec_only": spec, "cache_only": cache}) == subsystem


def _pools(flagged: dict[str, int], interval: int = 128) -> list[dict]:
    out = []
    for variant, n in flagged.items():
        out += [{"variant": variant, "interval": interval, "class": "drift"}] * n
        out += [{"variant": variant, "interval": interval}] * 4
    return out


def test_diagnosis_names_the_interplay_when_only_the_full_pool_is_flagged():
    d = diagnose(frame(_pools({"full": 3, "spec_only": 0, "cache_only": 0})
                       + _pools({"full": 1, "spec_only": 0, "cache_only": 0}, 256)))
    assert d.subsystem == "interplay"
    assert d.headline.startswith("The evidence points at the speculation x cache interplay (the #37817 class)")
    assert d.evidence == [
        "interval 128: i128 (full) flagged 3/7 (0 restored a checkpoint); i128-cache (cache_only) flagged 0/4 "
        "(0 restored a checkpoint); i128-spec (spec_only) flagged 0/4 (0 restored a checkpoint) -> interplay",
        "interval 256: i256 (full) flagged 1/5 (0 restored a checkpoint); i256-cache (cache_only) flagged 0/4 "
        "(0 restored a checkpoint); i256-spec (spec_only) flagged 0/4 (0 restored a checkpoint) -> interplay"]


def test_diagnosis_names_caching_and_says_when_intervals_disagree():
    assert diagnose(frame(_pools({"full": 3, "spec_only": 0, "cache_only": 2}))).subsystem == "caching"
    mixed = diagnose(frame(_pools({"full": 3, "spec_only": 0, "cache_only": 2})
                           + _pools({"full": 3, "spec_only": 0, "cache_only": 0}, 256)))
    assert mixed.subsystem == "mixed" and "interval 128: caching; interval 256: interplay" in mixed.headline


def test_without_diagnose_pools_the_attribution_is_summarised():
    restored = {"class": "drift", "cached_tokens": 128, "restored": True, "restored_verify_crossed": True}
    # bf16: a stale restore's drift may pass the limits a few outputs in (onset at the decode), not at output 0
    df = frame([{**restored, "onset_points_at": "restored_checkpoint"}] * 3
               + [{**restored, "onset_points_at": "decode"}] + [{}])
    d = diagnose(df)
    assert d.subsystem == "undiagnosed" and d.headline.startswith("The evidence points at the restored checkpoints")
    assert d.evidence[0] == ("4 flagged request(s); 4 of them restored a checkpoint (3 left the reference at it: in "
                             "their prompt past it or from their first output token, 4 restored a checkpoint that the "
                             "previous turn crossed inside a verify step)")
    mixed = diagnose(frame([restored, {"class": "hard", "onset_points_at": "decode"}]))
    assert mixed.headline == ("1 flagged request(s) restored nothing: not only the cache is implicated; --diagnose "
                              "would tell which subsystem.")
    assert diagnose(frame([{}])).subsystem == "none"


def test_cells_of_a_block():
    assert len(cells(8)) == 36 and cells(2) == [(0, 1), (0, 2), (1, 2)]


def test_coverage_counts_crossed_and_restored_cells():
    p0 = prompt(250)
    out0 = list(range(65, 81))
    p1 = p0 + out0 + prompt(10, 5)
    trace0 = [[251, 3, -1], [254, 3, -1], [257, 3, -1]]  # crosses 256 at step 1 of commit 3, untracked
    records = (pair(p0, out0, session_id="s", spec_trace=trace0)
               + pair(p1, [71] * 8, [70] * 8, session_id="s", turn=1, cached_tokens=256, spec_trace=[[277, 4, -1]]))
    cands = [r for r in records if r["role"] == "candidate"]
    df = analyze(cands, {r["input_hash"]: r for r in records if r["role"] == "reference"})
    cov = coverage_table(df)
    assert len(cov) == 36 and set(cov["interval"]) == {256}
    hit = cov[(cov["step"] == 1) & (cov["commit_len"] == 3)].iloc[0].to_dict()
    assert {k: hit[k] for k in ("crossed", "crossed_untracked", "restored", "restored_flagged",
                                "restored_untracked")} == {"crossed": 1, "crossed_untracked": 1, "restored": 1,
                                                           "restored_flagged": 1, "restored_untracked": 1}
    assert int(cov["crossed"].sum()) == 1 and int(cov["restored"].sum()) == 1
    assert coverage_summary(cov) == [{"interval": 256, "cells": 36, "crossed": 1, "restored": 1,
                                      "restored_flagged": 1}]


def _vllm_like_run() -> tuple[pd.DataFrame, TokenFacts]:
    """Records shaped like issue 26's vLLM run (bf16 Qwen3-Next, --calibrate --diagnose): the full pool crashed
    (every request an error), the speculation-only pool (no interval, no restore) drifts from the first output
    token, the cache-only pool's real restores are exact while two prompts one token past a block boundary that
    restored nothing drift from their first token (split prefills), and the baseline control is clean."""
    recs = []
    for s in range(4):
        p = prompt(65, seed=s)
        recs += pair(p, [100] * 8, pool="vllm", interval=64, session_id=f"f{s}", error="HTTP 500: engine dead",
                     spec_trace=None)
        spec = pair(p, [100] * 8, pool="vllm-spec", interval=None, session_id=f"s{s}", spec_trace=None)
        spec[0]["output_logprobs"] = [-0.33] * 8
        spec[0]["engine"]["radix_cache"] = False
        cache = pair(p, [100] * 8, pool="vllm-cache", interval=64, session_id=f"c{s}", spec_trace=None,
                     cached_tokens=64 if s < 2 else 0, accept=None)
        cache[0]["engine"]["speculative"] = False
        if s >= 2:
            cache[0]["output_logprobs"] = [-0.30] * 8
        base = pair(p, [100] * 8, pool="baseline", interval=None, session_id=f"b{s}", spec_trace=None, accept=None)
        base[0]["engine"].update(speculative=False, radix_cache=False)
        recs += spec + cache + base
    cands = [r for r in recs if r["role"] == "candidate"]
    for r in cands:
        if r["error"]:
            r["output_ids"], r["output_logprobs"], r["output_top_logprobs"] = [], [], []
    refs = {r["input_hash"]: r for r in recs if r["role"] == "reference"}
    df = analyze(cands, refs, per_pool={p: (0.5, 4e-4) for p in ("vllm", "vllm-spec", "vllm-cache", "baseline")})
    return df, TokenFacts.of({r["key"]: r for r in cands}, refs)


def test_diagnosis_reads_every_pool_of_a_vllm_shaped_run():
    from reports.gate import GateThresholds
    from reports.render import judge

    df, records = _vllm_like_run()
    verdict, lines, judged = judge(df, records, GateThresholds(min_coverage=0.3), True, {"vllm-spec": (0.5, 4e-4)})
    d = diagnose(judged)
    assert d.subsystem == "crashed"
    assert d.headline == ("The full candidate crashed (vllm: every request failed (first error: HTTP 500: engine "
                          "dead)): no subsystem can be named from its output; see the incidents and the pools' logs.")
    assert d.evidence == [
        "interval 64: vllm (full) crashed: 4/4 errors, nothing answered; vllm-cache (cache_only) flagged 0/4 "
        "(2 path numerics, 2 restored a checkpoint); vllm-spec (spec_only) flagged 0/4 (4 path numerics, 0 restored "
        "a checkpoint) -> crashed",
        "control baseline (cold) flagged 0/4 (0 restored a checkpoint)"]
    assert list(d.table["pool"]) == ["baseline", "vllm", "vllm-cache", "vllm-spec"]
    assert list(d.table["errors"]) == [0, 4, 0, 0] and list(d.table["path_numerics"]) == [0, 0, 2, 4]
    # the verdict: the crash fails it; the path numerics are explained, never advised away by a raised tolerance
    assert verdict.word == "FAIL" and verdict.reasons == ["4 request errors > allowed 0"]
    assert [line.split(":")[0] for line in lines] == ["pool vllm-cache", "pool vllm-spec"]
    assert all("--drift-tolerance" not in line and "path numerics" in line for line in lines)


def _speculation_only_vllm_run(full_flagged: bool = False, flip_margin: float = 0.8
                               ) -> tuple[pd.DataFrame, TokenFacts]:
    """Records shaped like the vLLM Qwen3-Next bf16 re-run (draft_model drafter, --no-enable-prefix-caching
    --calibrate --diagnose): the candidate `vllm` speculates without a prefix cache, so it restores nothing, and
    drifts from its first verify step (output 1, by 0.5; one request also flips a token after it, at reference
    margin `flip_margin`); `vllm-cache`'s restores are exact and a split prefill drifts from its first token; the
    baseline control is clean. With `full_flagged` a full candidate `vllm-full` (speculation + prefix cache) whose
    restored turns drift stands beside them."""
    recs = []
    for s in range(4):
        p = prompt(65, seed=s)
        out = [100 + j for j in range(8)]
        # a prompt of its own: the other pools' references (margin 5 everywhere) would stand for its reference
        spec = pair(prompt(65, seed=s + 4), out if s else out[:4] + [7] + out[5:], out,
                    margins=None if s else {4: flip_margin},
                    pool="vllm", interval=None, session_id=f"s{s}", spec_trace=None)
        spec[0]["output_logprobs"] = [-0.25] + [-0.75] * 7
        spec[0]["engine"]["radix_cache"] = False
        cache = pair(p, out, pool="vllm-cache", interval=64, session_id=f"c{s}", spec_trace=None,
                     cached_tokens=64 if s < 2 else 0, accept=None)
        cache[0]["engine"]["speculative"] = False
        if s == 3:
            cache[0]["output_logprobs"] = [-0.55] * 8
        base = pair(p, out, pool="baseline", interval=None, session_id=f"b{s}", spec_trace=None, accept=None)
        base[0]["engine"].update(speculative=False, radix_cache=False)
        recs += spec + cache + base
        if full_flagged:
            full = pair(p, out, pool="vllm-full", interval=64, session_id=f"f{s}", spec_trace=None,
                        cached_tokens=64 if s < 2 else 0)
            if s < 2:
                full[0]["output_logprobs"] = [-0.25] * 2 + [-0.9] * 6
            recs += full[:1]
    cands = [r for r in recs if r["role"] == "candidate"]
    refs = {r["input_hash"]: r for r in recs if r["role"] == "reference"}
    df = analyze(cands, refs, per_pool={p: (0.5, 0.234) for p in ("vllm", "vllm-cache", "vllm-full", "baseline")})
    return df, TokenFacts.of({r["key"]: r for r in cands}, refs)


_CALIBRATION = {p: {"controls": ["baseline"], "drift_max": 0.0584} for p in ("vllm", "vllm-cache", "vllm-full")}


def test_a_speculation_only_pool_that_no_control_shares_a_path_with_is_not_judged():
    from reports.gate import GateThresholds
    from reports.render import judge

    df, facts = _speculation_only_vllm_run()
    assert list(df[df["pool"] == "vllm"]["class"]) == ["hard", "drift", "drift", "drift"]
    verdict, lines, judged = judge(df, facts, GateThresholds(min_coverage=0.0), True,
                                   {"vllm": (0.5, 0.234), "vllm-cache": (0.5, 0.234)}, calibration=_CALIBRATION)
    assert (verdict.word, verdict.hard, verdict.drift, verdict.path_numerics) == ("INCONCLUSIVE", 0, 0, 5)
    assert lines == [
        "pool vllm: restored nothing, and no control shares its path (speculation, no prefix cache; calibrated "
        "against baseline only, whose largest drift is 0.0584): its 4 flagged request(s) (1 hard, 3 drift; drift up "
        "to 0.5, from the first output token (the prefill's) in 0, from a later output in 4; 12 verify steps in "
        "them) are this configuration's path numerics, or a bug on that path, and no control here tells them "
        "apart; not judged. To judge this path: --baseline-run a trusted run of this configuration",
        "pool vllm-cache: 1 request(s) drift from their first output token, before any verify step (first-token "
        "drift up to 0.3, up to 0.3 over the turn; the calibrated tolerance 0.234; 1 restored nothing): path "
        "numerics of this configuration's prefill, which its controls do not share; not judged. Calibrate against "
        "this configuration's own path: --baseline-run a trusted run of it"]
    d = diagnose(judged)
    assert (d.subsystem, d.headline) == ("none", "The evidence points at no subsystem: no request was flagged in any "
                                         "pool, and 5 request(s) are path numerics, not judged (the verdict says why).")
    assert d.evidence == [
        "interval 64: vllm-cache (cache_only) flagged 0/4 (1 path numerics, 2 restored a checkpoint); vllm "
        "(spec_only) not judged: 4/4 path numerics (it restored nothing, and no control shares its path) -> none",
        "control baseline (cold) flagged 0/4 (0 restored a checkpoint)"]
    # without the calibration's controls (or with a control of its own path) the pool is judged
    plain, _, _ = judge(df, facts, GateThresholds(min_coverage=0.0), True, {"vllm": (0.5, 0.234)})
    assert (plain.word, plain.hard, plain.drift) == ("FAIL", 1, 3)
    own = {**_CALIBRATION, "vllm": {"controls": ["vllm"], "drift_max": 0.6}}  # --baseline-run: its trusted pool
    trusted, _, _ = judge(df, facts, GateThresholds(min_coverage=0.0), True, {"vllm": (0.5, 0.234)},
                          calibration=own)
    assert (trusted.hard, trusted.drift) == (1, 3)


def test_a_flip_beyond_what_the_unjudged_path_moved_is_judged_and_names_speculation():
    """The same speculation-only pool, but its flip's reference margin (2.0) is more than twice the largest drift
    its path showed (0.5): no numerics of that size flip it, so it is hard whatever the pool restored; its drift
    stays path numerics, and with the cache-only pool clean the diagnosis names speculation."""
    from reports.gate import GateThresholds
    from reports.render import judge

    df, facts = _speculation_only_vllm_run(flip_margin=2.0)
    verdict, lines, judged = judge(df, facts, GateThresholds(min_coverage=0.0), True,
                                   {"vllm": (0.5, 0.234), "vllm-cache": (0.5, 0.234)}, calibration=_CALIBRATION)
    assert (verdict.word, verdict.hard, verdict.drift, verdict.path_numerics) == ("FAIL", 1, 0, 4)
    assert verdict.reasons[1] == (
        "pool vllm: 1 token flip(s) at output 4 that no measured numerics explain (reference margin 2 at the flip), "
        "where 2 x 0.5 = 1 is the most this path's numerics can close (its turns that restored nothing 0.5 (before "
        "any flip), its controls 0.0584, its tolerance 0.234): hard mismatches, whatever the pool restored")
    assert lines[0].startswith("pool vllm: restored nothing, and no control shares its path (speculation, no "
                               "prefix cache; calibrated against baseline only, whose largest drift is 0.0584): its "
                               "3 flagged request(s) (0 hard, 3 drift;")
    d = diagnose(judged)
    assert (d.subsystem, d.evidence[0]) == ("speculation", (
        "interval 64: vllm-cache (cache_only) flagged 0/4 (1 path numerics, 2 restored a checkpoint); vllm "
        "(spec_only) flagged 1/4 (3 path numerics, 0 restored a checkpoint) -> speculation"))


def test_a_flagged_full_candidate_beside_an_unjudged_half_names_no_single_subsystem():
    from reports.gate import GateThresholds
    from reports.render import judge

    df, facts = _speculation_only_vllm_run(full_flagged=True)
    verdict, _, judged = judge(df, facts, GateThresholds(min_coverage=0.0), True, None, calibration=_CALIBRATION)
    assert (verdict.word, verdict.drift) == ("FAIL", 2)
    d = diagnose(judged)
    assert d.subsystem == "undetermined" and d.headline == f"The evidence points at {SUBSYSTEMS['undetermined']}."


def _finding(pool: str, kind: str) -> RateTest:
    """A significant flip-rate test (reports/flip_rates.py) of `pool`."""
    test = ExactTest(1e-6, 1e-9, 12, 37, 1, 37)
    return RateTest(kind, "flip", pool, None, "restored a checkpoint", "restored nothing", test, 1, 1e-3, 1)


def test_flips_piling_up_point_where_no_single_turn_was_flagged():
    df = frame([{"cached_tokens": 128, "restored": True, "class": "soft"}] * 3 + [{}] * 3)
    assert diagnose(df).subsystem == "none"
    d = diagnose(df, (_finding("i128", "restored"),))
    assert d.subsystem == "undiagnosed"
    assert d.headline.startswith("No single request was flagged, but flips pile up where numerics do not put them: "
                                 "in turns that restored a checkpoint, more than in turns that restored nothing")
    assert d.headline.endswith(", in pool(s) i128 (the restored checkpoints: caching / checkpoint tracking, or the "
                               "speculation x cache interplay); --diagnose would tell which subsystem.")
    assert d.evidence[0].startswith("flips pile up: pool i128: token flips let through as soft, turns that restored ")
    assert "i128 (full) flagged 0/6 (3 restored a checkpoint, flips pile up in 1 rate test(s))" in d.evidence


def test_a_pool_whose_flips_pile_up_counts_as_flagged_for_the_subsystem():
    df = frame(_pools({"full": 0, "spec_only": 0, "cache_only": 0}))
    assert diagnose(df).subsystem == "none"
    assert diagnose(df, (_finding("i128", "controls"),)).subsystem == "interplay"
    assert diagnose(df, (_finding("i128", "controls"), _finding("i128-cache", "restored"))).subsystem == "caching"
