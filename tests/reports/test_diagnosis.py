"""The noise floor beside the tolerance, the differential diagnosis, and the boundary-cell coverage."""

from __future__ import annotations

import pandas as pd
import pytest

from reports.analyze import analyze
from reports.coverage import cells, coverage_summary, coverage_table
from reports.diagnosis import diagnose, interval_subsystem, noise_floor
from tests.reports.factory import pair, prompt


def frame(rows: list[dict]) -> pd.DataFrame:
    base = {"class": "exact", "cached_tokens": 0, "drift": 0.0, "oracle": "logprob", "interval": 128,
            "variant": "full", "onset_points_at": None, "restored_verify_crossed": False,
            "restored_link": None}
    return pd.DataFrame([{**base, **r} for r in rows])


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
    assert d.evidence == ["interval 128: flagged full 3/7, spec_only 0/4, cache_only 0/4 -> interplay",
                          "interval 256: flagged full 1/5, spec_only 0/4, cache_only 0/4 -> interplay"]


def test_diagnosis_names_caching_and_says_when_intervals_disagree():
    assert diagnose(frame(_pools({"full": 3, "spec_only": 0, "cache_only": 2}))).subsystem == "caching"
    mixed = diagnose(frame(_pools({"full": 3, "spec_only": 0, "cache_only": 2})
                           + _pools({"full": 3, "spec_only": 0, "cache_only": 0}, 256)))
    assert mixed.subsystem == "mixed" and "interval 128: caching; interval 256: interplay" in mixed.headline


def test_without_diagnose_pools_the_attribution_is_summarised():
    df = frame([{"class": "drift", "cached_tokens": 128, "onset_points_at": "restored_checkpoint",
                 "restored_verify_crossed": True}] * 3 + [{}])
    d = diagnose(df)
    assert d.subsystem == "undiagnosed" and d.headline.startswith("The evidence points at the restored checkpoints")
    assert d.evidence[0].startswith("3 flagged request(s); 3 of them restored a checkpoint")
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
