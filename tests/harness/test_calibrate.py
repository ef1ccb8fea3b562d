"""Calibration per code path: the control pools a run starts, and the thresholds each pool is gated with."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from harness.calibrate import DRIFT_FLOOR, calibrated_gate, calibrating
from harness.cli import from_argv
from harness.config import ConfigError
from harness.targets import run_config
from harness.targets.builtin import builtin_plan, server_args
from reports.gate import GateThresholds
from reports.render import render_run
from tests.harness.helpers import make_sessions
from tests.reports.factory import pair, prompt, write_run


def _plan(**kw):
    cfg = run_config(model_path="random", model_preset="tiny", page_size=16, intervals=(128,), **kw)
    return cfg, builtin_plan(cfg, make_sessions(2))


def test_bf16_calibrates_against_clean_controls_of_each_path():
    cfg, plan = _plan(dtype="bfloat16", inject_fault="stale-seq-lens")
    assert calibrating(cfg)
    names = [p.name for p in plan.candidates]
    assert names == ["i128", "ctl-i128-spec", "ctl-i128-cache"]
    engines = {p.name: p.engine for p in plan.candidates}
    assert engines["i128"].fault == "stale-seq-lens"
    assert engines["ctl-i128-spec"].fault is None and engines["ctl-i128-cache"].fault is None  # never a fault
    assert (engines["ctl-i128-spec"].speculative, engines["ctl-i128-spec"].radix_cache) == (True, False)
    assert (engines["ctl-i128-cache"].speculative, engines["ctl-i128-cache"].radix_cache) == (False, True)
    for p in (*plan.candidates, plan.reference):  # every pool runs the dtype, and its records say so
        args = server_args(cfg, p.engine)
        assert args[args.index("--dtype") + 1] == "bfloat16" and p.engine.record()["args"][:2] == ["--dtype",
                                                                                                     "bfloat16"]
    assert "--inject-fault" not in server_args(cfg, engines["ctl-i128-spec"])
    assert all(len(p.sessions) == 2 for p in plan.candidates)  # the controls serve the candidates' sessions


def test_fp32_is_exact_unless_asked(tmp_path):
    cfg, plan = _plan()
    assert not calibrating(cfg) and [p.name for p in plan.candidates] == ["i128"]
    assert "--dtype" not in server_args(cfg, plan.candidates[0].engine) and plan.candidates[0].engine.args == ()
    cfg, plan = _plan(calibrate=True)
    assert [p.name for p in plan.candidates] == ["i128", "ctl-i128-spec", "ctl-i128-cache"]
    trusted = _run(tmp_path, "last-release", [_pool("i128", 0.005)])
    cfg, plan = _plan(dtype="bfloat16", baseline_run=str(trusted))  # the trusted run's records instead
    assert calibrating(cfg) and [p.name for p in plan.candidates] == ["i128"]


def test_a_baseline_run_without_records_is_refused_before_anything_starts(tmp_path):
    (tmp_path / "empty" / "records").mkdir(parents=True)
    for path in (tmp_path / "missing", tmp_path / "empty"):
        with pytest.raises(ConfigError) as e:
            _plan(dtype="bfloat16", baseline_run=str(path))
        assert str(e.value) == (f"--baseline-run: {str(path)!r} is not a run directory with records (no files in "
                                f"{path / 'records'})")


def test_candidate_args_take_a_value_that_starts_with_dashes():
    cfg, explicit = from_argv(["--candidate-args", "--disable-radix-cache", "--intervals", "128"], {})
    assert cfg.target.candidate_args == ("--disable-radix-cache",) and cfg.intervals == (128,)
    cfg, _ = from_argv(["--candidate-args", "--drafter-mode scripted --scripted-accept 0"], {})
    assert cfg.target.candidate_args == ("--drafter-mode", "scripted", "--scripted-accept", "0")


def _pool(pool: str, drift: float, n: int = 3, *, radix: bool = True, speculative: bool = True) -> list[dict]:
    recs = []
    for s in range(n):
        c, ref = pair(prompt(40, seed=s), [100] * 8, pool=pool, interval=128, session_id=f"{pool}-{s}")
        c["output_logprobs"] = [-0.25 - drift * (s + 1) / n] * 8
        c["engine"].update(radix_cache=radix, speculative=speculative)
        recs += [c, ref]
    return recs


def _restored(recs: list[dict], first_drift: float) -> list[dict]:
    """`recs` with every candidate restoring 32 tokens and its first output token `first_drift` off the reference."""
    for r in recs:
        if r["role"] == "candidate":
            r["cached_tokens"] = 32
            r["output_logprobs"][0] = -0.25 - first_drift
    return recs


def _run(tmp_path, name, pools):
    recs = [r for p in pools for r in p]
    seen, unique = set(), []
    for r in recs:
        if r["key"] not in seen:
            seen.add(r["key"])
            unique.append(r)
    return write_run(tmp_path / name, unique, {"run_id": name})


def test_each_pool_takes_the_tolerance_of_the_controls_on_its_path(tmp_path):
    run = _run(tmp_path, "r", [_pool("i128", 0.3), _pool("i128-spec", 0.0, radix=False),
                               _pool("ctl-i128-spec", 0.02, radix=False), _pool("ctl-i128-cache", 0.01,
                                                                                  speculative=False)])
    gate, per_pool = calibrated_gate(run, GateThresholds(), tolerance_given=False)
    assert per_pool["i128"][1] == pytest.approx(4 * 0.02)  # both path controls: the larger drift
    assert per_pool["i128-spec"][1] == pytest.approx(4 * 0.02)  # the speculation-only control
    assert gate.drift_tolerance == pytest.approx(0.08)
    cal = json.loads((run / "config.json").read_text())["calibration"]
    assert cal["per_pool"]["i128"]["controls"] == ["ctl-i128-spec", "ctl-i128-cache"]
    assert cal["controls"] == ["ctl-i128-cache", "ctl-i128-spec"] and cal["uncalibrated"] == []
    assert cal["text"].startswith("clean ctl-i128-spec + ctl-i128-cache (the controls sharing its code paths, "
                                  "6 requests vs the reference): max drift 0.02")
    assert cal["per_pool"]["i128"]["restore_tolerance"] is None  # no control restored anything


def test_the_restore_tolerance_is_the_cache_controls_first_token_drift_of_restored_turns(tmp_path):
    restored = _restored(_pool("ctl-i128-cache", 0.01, speculative=False), first_drift=0.002)
    run = _run(tmp_path, "r", [_pool("i128", 0.3), _pool("ctl-i128-spec", 0.02, radix=False), restored])
    calibrated_gate(run, GateThresholds(), tolerance_given=False)
    cal = json.loads((run / "config.json").read_text())["calibration"]
    # the records are read as stored (float32 log-probs), as the render reads them
    assert cal["per_pool"]["i128"]["restore_tolerance"] == pytest.approx(4 * 0.002, rel=1e-5)
    assert "restore tolerance 0.008 (first output token of a restored turn)" in cal["text"]


def test_a_turn_whose_summed_drift_passes_the_envelope_fails_the_gate_within_the_tolerance(tmp_path):
    cand = _pool("i128", 0.075)
    for r in cand:
        r["output_logprobs"][0] = -0.25  # the prefill's token as the reference's: drift from output 1 on
    run = _run(tmp_path, "r", [cand, _pool("ctl-i128-spec", 0.02, radix=False),
                               _pool("ctl-i128-cache", 0.01, speculative=False)])
    gate, per_pool = calibrated_gate(run, GateThresholds(), tolerance_given=False)
    tol, env = per_pool["i128"][1], per_pool["i128"][2]
    assert tol == pytest.approx(0.08) and env.limits[:3] == pytest.approx((0.06, 0.24, 0.48))
    cal = json.loads((run / "config.json").read_text())["calibration"]
    assert cal["per_pool"]["i128"]["envelope"][:3] == pytest.approx([0.06, 0.24, 0.48])
    assert ("drift envelope 0.06, 0.24, 0.48, 0.48, 0.48 over the first 1, 4, 8, 16, 32 outputs (3x the controls' "
            "summed drift)") in cal["text"]
    verdict = render_run(run, gate, per_pool)
    rows = pd.read_csv(run / "requests.csv")
    cand = rows[rows["pool"] == "i128"].sort_values("session_id")
    # 0.075 a position stays within the tolerance 0.08; summed over outputs 0-7 (0.525) it passes the envelope 0.48
    assert list(cand["class"]) == ["exact", "exact", "drift"] and list(cand["drift_onset"].fillna(-1)) == [-1, -1, 7]
    assert cand["detail"].iloc[2] == ("log-prob drift summed over outputs 0-7 0.525 > the path's envelope 0.48 there "
                                      "(max 0.075)")
    assert verdict.exit_code == 1 and verdict.headline.startswith("FAIL: 0 hard mismatches, 1 drift")
    assert render_run(run).headline == verdict.headline  # re-rendered from config.json alone: the same judgement


def test_a_given_tolerance_keeps_no_envelope(tmp_path):
    run = _run(tmp_path, "r", [_pool("i128", 0.07), _pool("ctl-i128-spec", 0.02, radix=False)])
    _, per_pool = calibrated_gate(run, GateThresholds(drift_tolerance=0.5), tolerance_given=True)
    assert per_pool["i128"] == (0.5, 0.5, None)


def test_requests_csv_counts_a_restore_that_moved_the_first_token_as_the_verdict_does(tmp_path):
    restored = _restored(_pool("ctl-i128-cache", 0.01, speculative=False), first_drift=0.002)
    cand = _restored(_pool("i128", 0.0), first_drift=0.05)  # past the restore tolerance 0.008, within the rest
    run = _run(tmp_path, "r", [cand, _pool("ctl-i128-spec", 0.02, radix=False), restored])
    verdict = render_run(run, *calibrated_gate(run, GateThresholds(), tolerance_given=False))
    rows = pd.read_csv(run / "requests.csv")
    rows = rows[rows["pool"] == "i128"]
    assert list(rows["class"]) == ["drift"] * 3
    assert list(rows["detail"]) == ["first output token moved at the restore"] * 3
    assert verdict.headline.startswith("FAIL: 0 hard mismatches, 3 drift (3/3 requests)")


def test_a_trusted_run_calibrates_each_pool_by_its_own_name(tmp_path):
    trusted = _run(tmp_path, "release", [_pool("i128", 0.005)])
    run = _run(tmp_path, "change", [_pool("i128", 0.3), _pool("i256", 0.0)])
    gate, per_pool = calibrated_gate(run, GateThresholds(), False, baseline_run=str(trusted))
    assert list(per_pool) == ["i128"] and per_pool["i128"][:2] == (0.5, pytest.approx(0.02))
    # the trusted pool's largest summed drift (0.005 a position over 8 outputs) x 3, at 1, 4 and 8 outputs
    assert per_pool["i128"][2].limits[:3] == pytest.approx((0.015, 0.06, 0.12))
    cal = json.loads((run / "config.json").read_text())["calibration"]
    assert cal["uncalibrated"] == ["i256"] and cal["baseline_run"] == str(trusted)
    assert cal["text"].startswith(f"from the trusted run {trusted}: clean i128 (the controls sharing its code paths")


def test_without_controls_the_configured_thresholds_stay(tmp_path):
    run = _run(tmp_path, "r", [_pool("i128", 0.3)])
    gate, per_pool = calibrated_gate(run, GateThresholds(), False)
    assert gate == GateThresholds() and per_pool == {} and DRIFT_FLOOR == 1e-4
    assert json.loads((run / "config.json").read_text())["calibration"]["uncalibrated"] == ["i128"]


def test_the_soft_flip_rate_follows_the_controls_numerics_flips(tmp_path):
    spec = _pool("ctl-i128-spec", 0.0, n=4, radix=False)
    spec[0]["output_ids"] = [100] * 7 + [101]  # a near-tie flip of the control's first request (ref margin 0.1)
    spec[0]["output_top_logprobs"][7] = [[-0.25, 101], [-0.25, 100]]
    spec[1]["output_top_logprobs"][7] = [[-0.25, 100], [-0.35, 101]]  # its reference: margin 0.1 there
    run = _run(tmp_path, "r", [_pool("i128", 0.0), spec, _pool("ctl-i128-cache", 0.0, n=4, speculative=False)])
    gate, _ = calibrated_gate(run, GateThresholds(max_soft_rate=0.02), tolerance_given=False)
    # 1 flip in the 8 control requests: p = 1/8, which the 3 requests of i128 measure only to +- sqrt(p(1-p)/3)
    assert gate.max_soft_rate == pytest.approx(1 / 8 + 3 * (1 / 8 * 7 / 8 / 3) ** 0.5)
    cal = json.loads((run / "config.json").read_text())["calibration"]
    assert ("soft-flip rate allowed 69.8% (the controls' flip rate: 2x, or plus 3 binomial standard deviations at "
            "the pool's size)") in cal["text"]
    # what the flip-rate test (reports/flip_rates.py) compares each sweep point of i128 with: its controls together
    assert cal["per_pool"]["i128"]["flips_by_point"] == {"c1": [8, 1]}


def test_the_allowed_soft_rate_covers_the_spread_of_a_small_pool():
    from harness.calibrate import allowed_soft_rate

    # controls flipped 6 of 148: twice that is 8.1%, but a clean 74-request pool shows up to ~11% by chance
    assert allowed_soft_rate(6 / 148, 74) == pytest.approx(6 / 148 + 3 * (6 / 148 * (1 - 6 / 148) / 74) ** 0.5)
    assert allowed_soft_rate(0.2, 10_000) == pytest.approx(0.4)  # a large pool: twice the controls' rate
    assert allowed_soft_rate(0.0, 74) == 0.0  # controls that never flipped allow nothing beyond --max-soft-rate


def _windowed(recs: list[dict], moves: list[float]) -> list[dict]:
    """`recs` with each candidate restored at 32 and probed: window token i of candidate s moved by moves[s] (the
    reference's log-probs -1.0 each)."""
    cands = [r for r in recs if r["role"] == "candidate"]
    for r, move in zip(cands, moves, strict=True):
        n = r["input_len"] - 33
        r.update(cached_tokens=32, window_start=32, window_cached_tokens=32, window_ref_logprobs=[-1.0] * n,
                 window_logprobs=[-1.0 - move] * n)
    return recs


def test_the_restore_window_is_judged_by_the_cache_controls_windows(tmp_path):
    """A restored turn whose prompt moved past its checkpoint fails the gate though its outputs are exact: the
    window's limits come from the clean cache-only control's own windows (4x their largest move; 3x their sums)."""
    cache = _windowed(_pool("ctl-i128-cache", 0.01, speculative=False), [0.001, 0.002, 0.004])
    cand = _windowed(_pool("i128", 0.0), [0.0, 0.01, 0.2])
    run = _run(tmp_path, "r", [cand, _pool("ctl-i128-spec", 0.02, radix=False), cache])
    gate, per_pool = calibrated_gate(run, GateThresholds(), tolerance_given=False)
    cal = json.loads((run / "config.json").read_text())["calibration"]["per_pool"]["i128"]
    assert cal["window_tolerance"] == pytest.approx(4 * 0.004, rel=1e-4)
    assert cal["window_envelope"][:2] == pytest.approx([3 * 0.004, 3 * 4 * 0.004], rel=1e-4)
    verdict = render_run(run, gate, per_pool)
    rows = pd.read_csv(run / "requests.csv")
    cand = rows[rows["pool"] == "i128"].sort_values("session_id")
    assert list(cand["class"]) == ["exact", "exact", "drift"]
    assert list(cand["window_status"]) == ["compared", "compared", "flagged"]
    assert cand["detail"].iloc[2] == ("prompt log-prob drift 0.2 at prompt token 33 (1 past the restored checkpoint "
                                      "32) > window tolerance 0.016")
    assert cand["onset_points_at"].iloc[2] == "restored_checkpoint"
    assert verdict.exit_code == 1 and verdict.headline.startswith("FAIL: 0 hard mismatches, 1 drift")
    summary = (run / "summary.md").read_text()
    assert ("Restore windows: pool i128: 3 of 3 restored turn(s) compared on their restore window, 1 past its "
            "limits.") in summary
    page = (run / "report.html").read_text()  # the flagged case shows its window: both sides' log-probs per token
    assert ("<b>Restore window</b> (prompt tokens past the restored checkpoint 32, scored on the candidate and the "
            "reference): it passed its limits at prompt token 33") in page
    assert "<td>-1.200</td>" in page and '<td class="first">2.0e-01</td>' in page
    assert render_run(run).headline == verdict.headline  # re-rendered from config.json alone


def test_an_uncalibrated_run_judges_the_window_by_its_drift_tolerance(tmp_path):
    cand = _windowed(_pool("i128", 0.0), [0.0, 0.0005, 0.002])
    run = _run(tmp_path, "r", [cand])
    verdict = render_run(run)  # fp32: the 1e-3 tolerance
    rows = pd.read_csv(run / "requests.csv").sort_values("session_id")
    assert list(rows["window_status"]) == ["compared", "compared", "flagged"]
    assert verdict.headline.startswith("FAIL: 0 hard mismatches, 1 drift")
