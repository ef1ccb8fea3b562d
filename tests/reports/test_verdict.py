"""INCONCLUSIVE (a run that did not exercise what it gates), path numerics, and the verdict's exit statuses."""

from __future__ import annotations

import pandas as pd
import pytest

from reports.analyze import analyze
from reports.controls import controls_of, is_control, path_numerics
from reports.exercised import server_acceptance, unexercised
from reports.facts import TokenFacts
from reports.gate import EXIT_GATE_FAILED, EXIT_INCONCLUSIVE, EXIT_PASS, GateThresholds, evaluate
from reports.render import judge
from tests.reports.factory import pair, prompt, spec_trace


def _frame(records: list[dict]) -> tuple[pd.DataFrame, TokenFacts]:
    cands = [r for r in records if r["role"] == "candidate"]
    refs = {r["input_hash"]: r for r in records if r["role"] == "reference"}
    return analyze(cands, refs), TokenFacts.of({r["key"]: r for r in cands}, refs)


def _session(pool: str, s: int, *, radix: bool = True, speculative: bool = True, commits=(3, 2, 4),
             restore: bool = True, interval: int = 128) -> list[dict]:
    """Turn 0 decodes across `interval` (prompt interval - 2); turn 1 restores it (with `restore`)."""
    engine = {"speculative": speculative, "radix_cache": radix}
    p0, out0 = prompt(interval - 2, seed=s), [100 + j % 20 for j in range(16)]
    trace0 = spec_trace(len(p0), 16, list(commits), interval, False) if speculative else None
    p1 = p0 + out0 + prompt(8, seed=9)
    trace1 = spec_trace(len(p1), 12, list(commits), interval, False) if speculative else None
    recs = pair(p0, out0, pool=pool, interval=interval, session_id=f"{pool}-{s}", spec_trace=trace0)
    recs += pair(p1, [120 + j % 7 for j in range(12)], pool=pool, interval=interval, session_id=f"{pool}-{s}",
                 turn=1, cached_tokens=interval if restore else 0, spec_trace=trace1)
    for r in recs:
        if r["role"] == "candidate":
            r["engine"].update(engine)
            if not speculative:
                r["spec_verify_ct"], r["spec_accept_length"] = None, None
    return recs


def test_a_caching_pool_that_restored_nothing_is_inconclusive():
    df, records = _frame(_session("i128", 0, restore=False) + _session("i128", 1, restore=False))
    found = unexercised(df, records, min_coverage=0.0)
    assert [(u.pool, u.check) for u in found] == [("i128", "restore")]
    assert found[0].text().startswith("pool i128: the radix cache restored no checkpoint in 4 answered requests")
    assert "--disable-radix-cache" in found[0].text()
    verdict = evaluate(df, GateThresholds(), [u.text() for u in found])
    assert (verdict.word, verdict.exit_code, verdict.passed) == ("INCONCLUSIVE", EXIT_INCONCLUSIVE, False)
    assert verdict.headline.startswith("INCONCLUSIVE: 0 hard mismatches, 0 drift (0/4 requests)")


def test_a_drafter_that_never_agrees_is_inconclusive():
    """Every verify step commits only its bonus token: no draft accepted (boundaries are still crossed)."""
    df, records = _frame(_session("i128", 0, commits=(1,)) + _session("i128", 1, commits=(1,)))
    checks = [u.check for u in unexercised(df, records, min_coverage=0.0)]
    assert checks == ["acceptance"]


def test_acceptance_from_the_counters_without_spec_trace():
    recs = _session("i128", 0) + _session("i128", 1)
    for r in recs:
        if r["role"] == "candidate":
            r["spec_trace"] = None
            r["spec_verify_ct"] = r["completion_tokens"] - 1  # one token per verify step after the prefill's
    df, records = _frame(recs)
    assert [u.check for u in unexercised(df, records, 0.0)] == ["acceptance"]
    for r in recs:
        if r["role"] == "candidate":
            r["spec_verify_ct"] = 4
    df, records = _frame(recs)
    assert unexercised(df, records, 0.0) == []


def test_no_boundary_crossed_inside_a_verify_step_is_inconclusive():
    recs = []
    for s in range(2):  # prompts far below the boundary: 16 + 12 tokens never reach 128
        p0 = prompt(40, seed=s)
        recs += pair(p0, [100] * 16, pool="i128", interval=128, session_id=f"s{s}",
                     spec_trace=spec_trace(40, 16, [3], 128, False))
    df, records = _frame(recs)
    found = unexercised(df, records, 0.0)
    assert [u.check for u in found] == ["restore", "verify-crossing"]
    assert "(from spec_trace)" in found[1].what


def test_coverage_below_min_coverage_is_inconclusive_and_above_it_passes():
    df, records = _frame(_session("i128", 0) + _session("i128", 1))
    restored_cells = 1  # turn 1 restored the checkpoint turn 0's verify step crossed: one (step, commit) cell
    share = restored_cells / 36
    found = unexercised(df, records, min_coverage=share + 0.01)
    assert [u.check for u in found] == ["coverage"]
    assert found[0].what.startswith("1 of the 36 (verify step, commit length) boundary cells of B=8 were crossed "
                                    "and restored (3% < --min-coverage")
    assert unexercised(df, records, min_coverage=share) == []


def test_a_fail_takes_precedence_over_inconclusive():
    df = pd.DataFrame({"class": ["hard", "exact"]})
    verdict = evaluate(df, GateThresholds(), ["pool x: nothing restored; change y"])
    assert (verdict.word, verdict.exit_code) == ("FAIL", EXIT_GATE_FAILED)
    assert (evaluate(df.iloc[1:], GateThresholds()).exit_code, EXIT_PASS) == (0, 0)


def test_controls_share_the_candidates_code_paths():
    present = {"ctl-i128-spec", "ctl-i128-cache", "baseline"}
    assert controls_of("i128", "full", 128, present) == ["ctl-i128-spec", "ctl-i128-cache"]
    assert controls_of("i128-spec", "spec_only", 128, present) == ["ctl-i128-spec"]
    assert controls_of("i256", "full", 256, present) == ["baseline"]  # no path control there
    assert controls_of("vllm", "full", None, {"baseline"}) == ["baseline"]
    assert controls_of("vllm", "full", None, set()) == []
    assert [is_control(p) for p in ("baseline", "ctl-i128-spec", "i128", "i128-spec")] == [True, True, False, False]


@pytest.mark.parametrize("cls, onset, flip, restored, own_max, expected", [
    ("drift", 0, None, False, None, True),  # nothing restored, drift from the prefill's token: path numerics
    ("drift", 3, None, False, None, False),  # drift that starts after verify steps ran: judged
    ("drift", 0, None, True, 0.5, True),  # a restored turn within its pool's own unrestored path numerics
    ("drift", 0, None, True, 0.1, False),  # a restored turn beyond them: the restore's effect
    ("drift", 0, None, True, None, False),  # a restored turn in a pool without path numerics
    ("hard", 0, 9, False, None, True),  # nothing restored, a flip after drift from the prefill's token
    ("hard", 0, 0, False, None, False),  # the first token itself flipped: judged
    ("hard", None, 9, False, None, False),  # a flip with no drift before it: judged
    ("hard", 4, 9, False, None, False),  # drift that starts after verify steps, then a flip: judged
    ("hard", 0, 9, True, 0.5, False),  # a restored turn that flips is always judged
])
def test_path_numerics(cls, onset, flip, restored, own_max, expected):
    rows = [{"pool": "p", "class": cls, "drift_onset": onset, "first_divergence": flip, "restored": restored,
             "drift": 0.3}]
    if own_max is not None:
        rows.append({"pool": "p", "class": "drift", "drift_onset": 0, "first_divergence": None, "restored": False,
                     "drift": own_max})
    assert bool(path_numerics(pd.DataFrame(rows)).iloc[0]) is expected


def test_judge_excludes_controls_and_reports_path_numerics_only_when_calibrated():
    recs = []
    for s in range(2):  # a pool whose turns restore nothing and drift from their first output token
        p = prompt(126, seed=s)
        c, ref = pair(p, [100] * 16, pool="i128-spec", interval=128, session_id=f"s{s}",
                      spec_trace=spec_trace(126, 16, [3, 2, 4], 128, False))
        c["output_logprobs"] = [-0.75] * 16
        c["engine"]["radix_cache"] = False
        recs += [c, ref]
    ctl = pair(prompt(126, seed=7), [100] * 16, pool="ctl-i128-spec", interval=128, session_id="c",
               spec_trace=spec_trace(126, 16, [3, 2, 4], 128, False))
    ctl[0]["output_logprobs"] = [-0.25 - 2.0] * 16  # a control is never gated, however it drifts
    df, records = _frame(recs + ctl)
    verdict, lines, _ = judge(df, records, GateThresholds(min_coverage=0.0), calibrated=True,
                           per_pool={"i128-spec": (0.5, 0.01)})
    assert (verdict.requests, verdict.drift, verdict.path_numerics, verdict.word) == (2, 0, 2, "INCONCLUSIVE")
    assert lines == ["pool i128-spec: 2 request(s) drift from their first output token, before any verify step "
                     "(first-token drift up to 0.5, up to 0.5 over the turn; the calibrated tolerance 0.01; 2 "
                     "restored nothing; 10 verify steps in them): path numerics of this configuration's prefill, "
                     "which its controls do not share; not judged. Calibrate against this configuration's own path: "
                     "--baseline-run a trusted run of it"]
    fp32, _, _ = judge(df, records, GateThresholds(min_coverage=0.0), calibrated=False, per_pool=None)
    assert (fp32.drift, fp32.path_numerics, fp32.word) == (2, 0, "FAIL")


def test_a_flip_after_drift_from_the_prefills_token_is_path_numerics_and_a_restored_flip_is_judged():
    """vLLM's speculation-only pool (no prefix cache): its prefill's token already drifts, and the drift grows until
    a token flips; with nothing restored that is path numerics, reported with its first-token and whole-turn drift.
    The same shape in a restored turn is what the gate exists for: hard."""
    out = [100 + j % 9 for j in range(16)]
    flipped = out[:10] + [7] + out[11:]
    recs = []
    for s, (cand_out, cached) in enumerate([(out, 0), (flipped, 0), (flipped, 128)]):
        c, ref = pair(prompt(140, seed=s), cand_out, out, margins={10: 3.0}, pool="vllm", interval=None,
                      session_id=f"s{s}", turn=1 if cached else 0, cached_tokens=cached)
        c["engine"]["radix_cache"] = False
        c["output_logprobs"] = [-0.28] + [-0.25 - 0.1 * min(j, 4) for j in range(1, 16)]
        recs += [c, ref]
    df, facts = _frame(recs)
    assert list(df["class"]) == ["drift", "hard", "hard"]
    verdict, lines, judged = judge(df, facts, GateThresholds(min_coverage=0.0), calibrated=True,
                                   per_pool={"vllm": (0.5, 0.01)})
    assert list(judged["class"]) == ["path_numerics", "path_numerics", "hard"]
    assert (verdict.hard, verdict.drift, verdict.path_numerics, verdict.word) == (1, 0, 2, "FAIL")
    assert lines == ["pool vllm: 2 request(s) drift from their first output token, before any verify step "
                     "(first-token drift up to 0.03, up to 2 over the turn; the calibrated tolerance 0.01; 2 "
                     "restored nothing; 1 of them then flip a token; 10 verify steps in them): path numerics of this "
                     "configuration's prefill, which its controls do not share; not judged. Calibrate against this "
                     "configuration's own path: --baseline-run a trusted run of it"]


def test_a_restore_that_moves_the_first_token_is_drift_under_a_loose_turn_tolerance():
    """bf16: verify numerics move whole turns by 0.17, so the pool's tolerance is ~0.7; the first output token of a
    restored turn moves <= 0.006 through a split prefill; a restore that moves it past its tolerance is drift."""
    recs = []
    for s, first in enumerate((0.004, 0.05)):
        c, ref = pair(prompt(140, seed=s), [100] * 8, pool="i128", interval=128, session_id=f"s{s}",
                      cached_tokens=128, spec_trace=spec_trace(140, 8, [3, 2, 4], 128, False))
        c["output_logprobs"] = [-0.25 - first] + [-0.25 - 0.3] * 7  # 0.3 later on: verify numerics
        recs += [c, ref]
    df, records = _frame(recs)
    refs = {r["input_hash"]: r for r in recs if r["role"] == "reference"}
    per_pool = {"i128": (0.5, 0.7)}
    df = analyze([r for r in recs if r["role"] == "candidate"], refs, per_pool=per_pool)
    verdict, _, judged = judge(df, records, GateThresholds(min_coverage=0.0), True, per_pool, {"i128": 0.015})
    assert list(judged["class"]) == ["exact", "drift"]
    assert judged["detail"].iloc[1] == "first output token moved at the restore"
    assert (verdict.drift, verdict.word) == (1, "FAIL")
    plain, _, _ = judge(df, records, GateThresholds(min_coverage=0.0), True, per_pool, {})
    assert (plain.drift, plain.reasons) == (0, [])  # without a restore tolerance it passes every threshold


def test_acceptance_from_the_servers_counters_where_no_record_reports_it():
    """vLLM reports no per-request verify counts: the run's /metrics counters (server_counters.json) decide."""
    recs = _session("i128", 0) + _session("i128", 1)
    for r in recs:
        if r["role"] == "candidate":
            r["spec_trace"], r["spec_verify_ct"], r["spec_accept_length"] = None, None, None
    df, records = _frame(recs)
    assert unexercised(df, records, 0.0) == []  # nothing reported: nothing to conclude from
    counters = {"i128": {"http://a": {"delta": {"vllm:spec_decode_num_draft_tokens_total": 5712.0,
                                                "vllm:spec_decode_num_accepted_tokens_total": 0.0}},
                         "http://b": {"delta": {"vllm:spec_decode_num_draft_tokens_total": 8.0}}},
                "reference": {"http://c": {"delta": {"vllm:prefix_cache_hits_total": 0.0}}}}
    counted = server_acceptance(counters)
    assert counted == {"i128": (0, 5720)}
    found = unexercised(df, records, 0.0, counted)
    assert [(u.pool, u.check) for u in found] == [("i128", "acceptance")]
    assert "(the server's counters: 0 of 5720 draft tokens accepted)" in found[0].text()
    counters["i128"]["http://b"]["delta"]["vllm:spec_decode_num_accepted_tokens_total"] = 3.0
    assert unexercised(df, records, 0.0, server_acceptance(counters)) == []


def test_the_summary_counts_restored_crossings_of_the_gated_pools_only(tmp_path):
    """A calibration control's restores (a cache-only control: position-linked) were counted beside the candidate's,
    so a fault run read 'position-linked: 2, of which flagged 0' as if two affected turns had been missed."""
    from reports.render import render_run
    from tests.reports.factory import write_run

    recs = _session("i128", 0) + _session("ctl-i128-cache", 1, speculative=False)
    write_run(tmp_path, recs, {"min_coverage": 0.0})
    render_run(tmp_path)
    summary = (tmp_path / "summary.md").read_text()
    assert "Turns that restored a checkpoint their previous turn crossed inside a verify step: 1, of which flagged " \
           "(hard or drift): 0." in summary
    assert "position-linked" not in summary
    assert "(position-linked)" not in (tmp_path / "report.html").read_text()
