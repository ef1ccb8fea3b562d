"""Pure parts of the vLLM profile: calibration from a baseline, boundary sessions from a block, the models CLI."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from harness.calibrate import DRIFT_FLOOR, calibrate
from harness.models.__main__ import main as models_main
from harness.targets.vllm import acceptance_lines, check_flags
from harness.targets.vllm_profile import make_pool
from harness.targets.vllm_workload import boundary_sessions, offsets
from reports.gate import GateThresholds

BYTE_TOKENIZER = str(Path(__file__).resolve().parents[2] / "protocol" / "data" / "byte_tokenizer")


def _frame(rows):
    """An analyzed control frame: one sweep point (c1); a turn flipped where it has a margin at its flip."""
    df = pd.DataFrame(rows, columns=["class", "drift", "ref_margin"])
    df["first_divergence"] = df["ref_margin"].notna().map({True: 3, False: None})
    df["key"], df["pool"], df["concurrency"] = [f"s{i}/0" for i in range(len(df))], "baseline", 1
    return df


@pytest.mark.parametrize("rows, given, tolerance, margin, flips", [
    ([("exact", 0.0, None), ("exact", 0.0, None)], False, DRIFT_FLOOR, 0.5, 0),  # bit-identical: the floor
    ([("exact", 0.002, None), ("soft", 0.001, 0.04)], False, 0.008, 0.5, 1),  # 4x drift; a near-tie flip
    ([("exact", 0.01, None), ("soft", 0.0, 0.4)], False, 0.04, 0.8, 1),  # a flip at 0.4 raises the margin to 0.8
    ([("exact", 0.01, None), ("error", None, None)], True, 0.05, 0.5, 0),  # --drift-tolerance kept; errors ignored
])
def test_calibration_table(rows, given, tolerance, margin, flips):
    cal = calibrate(_frame(rows), GateThresholds(drift_tolerance=0.05, margin_threshold=0.5), given)
    assert cal.drift_tolerance == pytest.approx(tolerance) and cal.margin_threshold == pytest.approx(margin)
    assert cal.flips == flips and cal.requests == sum(r[0] != "error" for r in rows)
    assert cal.tolerance_source == ("--drift-tolerance" if given else "calibrated")
    assert cal.flips_by_point == {"c1": [cal.requests, flips]}
    assert "clean baseline" in cal.text()


def test_offsets_straddle_the_boundary_by_the_verify_width():
    assert offsets(5) == [-6, -5, -2, -1, 0, 1, 5]
    assert offsets(None) == [-2, -1, 0, 1]


def test_boundary_sessions_sit_at_exact_token_lengths_around_the_block():
    sessions = boundary_sessions(BYTE_TOKENIZER, 128, 5)
    lens = [s.meta["turn0_len"] for s in sessions]
    assert lens == [128 * k + o for k in (1, 2, 3) for o in offsets(5)]
    assert all(len(s.turns[0].input_ids) == s.meta["turn0_len"] and len(s.turns) == 2 for s in sessions)
    assert all(s.interval == 128 and s.turns[0].max_new_tokens == 18 for s in sessions)
    assert len({s.turns[0].input_ids[:8] for s in sessions}) == len(sessions)  # no prefix shared across cases
    assert sessions == boundary_sessions(BYTE_TOKENIZER, 128, 5)  # deterministic
    assert max(s.meta["boundary"] for s in boundary_sessions(BYTE_TOKENIZER, 640, 5)) == 1920  # fits 2048


def test_a_server_that_overrides_its_flags_is_named():
    asked = make_pool("vllm", "candidate", ("--enable-prefix-caching",))
    info = {"disable_radix_cache": True, "speculative_algorithm": "NONE", "specgate_probe": {"declared": []}}
    assert "asked for prefix caching on, the server reports it off" in check_flags("vllm", asked, info)
    assert check_flags("vllm", asked, dict(info, disable_radix_cache=False)) is None


def test_acceptance_lines_from_server_counters(tmp_path):
    path = tmp_path / "server_counters.json"
    path.write_text('{"vllm": {"u": {"delta": {"vllm:spec_decode_num_draft_tokens_total": 40, '
                    '"vllm:spec_decode_num_accepted_tokens_total": 30, "vllm:spec_decode_num_drafts_total": 10}}},'
                    ' "reference": {"u": {"delta": {}}}}')
    assert acceptance_lines(path) == ["pool vllm (/metrics): accept rate 75.0% (30/40 draft tokens), mean accepted "
                                      "length 4.00 per verify step"]


def test_models_build_without_a_vllm_interpreter_says_what_to_do(tmp_path, capsys):
    assert models_main(["build", str(tmp_path / "m"), "--arch", "llama", "--vllm-python",
                        str(tmp_path / "none" / "python")]) == 2
    assert "make vllm" in capsys.readouterr().err
