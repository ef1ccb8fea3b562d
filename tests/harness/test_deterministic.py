"""--deterministic: every pool asked for its target's deterministic mode (the built-in engine's and SGLang's
--enable-deterministic-inference, vLLM's VLLM_BATCH_INVARIANT=1), a server that reports running without it
refused, what each confirms recorded, and the calibration's exact paths."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from harness.calibrate import calibrate
from harness.cli import from_argv
from harness.placement import CPU
from harness.targets import make_target
from reports.deterministic import deterministic_text
from reports.gate import GateThresholds
from tests.harness.targets.test_profiles import environment_of, launches, target_of

FLAG = "--enable-deterministic-inference"


@pytest.fixture
def model(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"vocab_size": 300}))
    return str(d)


def builtin(*extra: str):
    return make_target(from_argv(["--dtype", "bfloat16", "--intervals", "128", *extra], {})[0])


def test_builtin_every_pool_s_engine_config_asks_for_the_mode():
    target = builtin("--deterministic")
    runs = launches(target, CPU)
    assert set(runs) == {"i128", "ctl-i128-spec", "ctl-i128-cache", "reference"}  # bf16: the controls too
    for name, launch in runs.items():
        assert launch.engine_cfg["enable_deterministic_inference"] is True, name
        assert FLAG in launch.args, name
    assert all(FLAG not in launch.args and not launch.engine_cfg["enable_deterministic_inference"]
               for launch in launches(builtin(), CPU).values())


def test_sglang_every_pool_s_server_gets_the_flag(model, tmp_path):
    runs = launches(target_of("sglang", model, tmp_path, "--device", "cpu", "--deterministic"), CPU)
    assert runs and all(list(launch.args).count(FLAG) == 1 for launch in runs.values())
    assert all(FLAG not in launch.args for launch in launches(target_of("sglang", model, tmp_path, "--device", "cpu"),
                                                              CPU).values())


def test_vllm_every_pool_s_server_gets_batch_invariance_in_its_environment(model, tmp_path):
    runs = launches(target_of("vllm", model, tmp_path, "--device", "cpu", "--deterministic"), CPU)
    for launch in runs.values():
        env = environment_of(launch, tmp_path, "")
        assert env["VLLM_BATCH_INVARIANT"] == "1" and env["OMP_NUM_THREADS"] == "1"  # the CPU profile's kept
    plain = launches(target_of("vllm", model, tmp_path, "--device", "cpu"), CPU)
    assert all("VLLM_BATCH_INVARIANT" not in environment_of(launch, tmp_path, "") for launch in plain.values())


POOL = next(p for p in builtin().plan([], {}).candidates if p.name == "i128")


@pytest.mark.parametrize("info, refused", [({"enable_deterministic_inference": True}, None),
                                           ({"enable_deterministic_inference": False}, "reports"),
                                           ({}, "does not report")])
def test_a_server_without_the_mode_is_refused(info, refused):
    problem = builtin("--deterministic").check_reported(POOL, "http://x", {"mamba_track_interval": 128, **info})
    if refused is None:
        assert problem is None
    else:
        assert problem.startswith("pool i128: --deterministic") and refused in problem and FLAG in problem
    assert builtin().check_reported(POOL, "http://x", {"mamba_track_interval": 128, **info}) is None


def test_sglang_refuses_a_server_reporting_it_off_and_vllm_records_its_environment(model, tmp_path):
    sglang = target_of("sglang", model, tmp_path, "--device", "cpu", "--deterministic")
    assert "enable_deterministic_inference: false" in sglang.deterministic(POOL, {DKEY: False})[0]
    vllm = target_of("vllm", model, tmp_path, "--device", "cpu", "--deterministic")
    assert vllm.deterministic(POOL, {}) == (None, "VLLM_BATCH_INVARIANT=1 in its environment (set by the harness; "
                                                  "vLLM does not report it)")


DKEY = "enable_deterministic_inference"


def test_endpoints_take_the_user_s_word_where_a_server_cannot_report_it():
    cfg = from_argv(["--endpoint", "http://a:1", "--reference-endpoint", "http://b:1", "--deterministic"], {})[0]
    target = make_target(cfg)
    assert target.deterministic(POOL, {}) == (None, f"asserted by --deterministic (the server does not report {DKEY})")
    assert "it runs without it" in target.deterministic(POOL, {DKEY: False})[0]
    assert target.deterministic(POOL, {DKEY: True})[0] is None


def _controls(drifts, classes):
    soft = [c == "soft" for c in classes]
    return pd.DataFrame({"key": [f"ctl-i128-spec-c4/s{i}/0" for i in range(len(drifts))], "pool": "ctl-i128-spec",
                         "drift": drifts, "class": classes, "ref_margin": [0.01 if s else None for s in soft],
                         "first_divergence": [3 if s else None for s in soft], "concurrency": 4})


@pytest.mark.parametrize("drifts, classes, exact", [([0.0, 0.0], ["exact", "exact"], True),
                                                    ([0.0, 1e-6], ["exact", "exact"], False),
                                                    ([0.0, 0.0], ["exact", "soft"], False)])
def test_controls_with_no_drift_and_no_flip_make_a_deterministic_path_exact(drifts, classes, exact):
    cal = calibrate(_controls(drifts, classes), GateThresholds(), False, ("ctl-i128-spec",), deterministic=True)
    assert cal.exact is exact
    assert (cal.drift_tolerance == 0 and cal.margin_threshold == 0) is exact
    assert ("EXACT" in cal.text()) is exact
    assert not calibrate(_controls(drifts, classes), GateThresholds(), False, ("ctl-i128-spec",)).exact
    assert not calibrate(_controls(drifts, classes), GateThresholds(), True, ("ctl-i128-spec",), True).exact


def test_the_report_says_what_was_confirmed_and_which_paths_were_exact():
    config = {"deterministic": {"i128": "the server reports x", "reference": "the server reports x"},
              "calibration": {"per_pool": {"i128": {}, "i256": {}, "ctl-i128-spec": {}}, "exact": ["i128"]}}
    text = deterministic_text(config)
    assert "i128, reference: the server reports x" in text and "exact paths" in text and text.endswith(
        "calibrated tolerances elsewhere: i256")
    assert deterministic_text({"deterministic": None}) is None
