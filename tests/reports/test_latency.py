"""Latency per sweep point (reports/latency.py), its configs.csv rows, the report section and the figure."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from reports.analyze import analyze
from reports.html_latency import latency_section
from reports.latency import latency_by_point, parse_slo, request_latency
from reports.plots_latency import latency_vs_load
from reports.tables import configs_table
from tests.reports.factory import candidate, prompt, reference


def _rate(k: int, rate: float, t_start: float, t_planned: float, ttft: float, e2e: float, n: int = 11,
          error: str | None = None, ttst: float | None = None) -> dict:
    return candidate(prompt(40, k), [65] * n, key=f"i256-r{rate:g}/s{k}/0", session_id=f"s{k}", concurrency=None,
                     request_rate=rate, arrival="poisson", t_start=t_start, t_planned=t_planned, ttft=ttft,
                     e2e=e2e, ttst=ttst, error=error)


def test_parse_slo_in_seconds_and_errors_name_the_flag():
    assert parse_slo("ttft_ms=500, tpot_ms=50") == {"ttft": 0.5, "tpot": 0.05}
    assert parse_slo(None) == {} and parse_slo("") == {}
    for bad, msg in (("ttfb_ms=5", "unknown objective 'ttfb_ms'"), ("ttft_ms=x", "needs a number"),
                     ("ttft_ms=0", "must be > 0"), ("ttft_ms=inf", "must be > 0")):
        with pytest.raises(ValueError, match=f"--slo: .*{msg}"):
            parse_slo(bad)


def test_request_metrics():
    rec = _rate(0, 2.0, t_start=10.25, t_planned=10.0, ttft=0.1, e2e=1.1, ttst=0.15)
    row = request_latency([rec]).iloc[0]
    assert row["point"] == "r2" and row["tpot"] == pytest.approx(0.1)  # (1.1 - 0.1) / (11 - 1)
    assert row["lag"] == pytest.approx(0.25) and row["ttst"] == 0.15 and row["rate"] == 2.0
    one = request_latency([_rate(1, 2.0, 10.0, 10.0, 0.1, 0.1, n=1)]).iloc[0]
    assert math.isnan(one["tpot"])  # one token: no time per output token


def test_point_percentiles_rates_and_slo():
    # four requests of one rate point over 4.5 s (from 10.0 to request 2's end, 12 + 2.5): one failed
    recs = [_rate(0, 2.0, 10.0, 10.0, 0.1, 1.1), _rate(1, 2.0, 11.0, 10.5, 0.3, 1.3),
            _rate(2, 2.0, 12.0, 11.0, 0.5, 2.5), _rate(3, 2.0, 13.0, 11.5, 0.2, 0.2, error="boom")]
    recs[3]["e2e"] = 1.0
    (key, p), = latency_by_point(recs, parse_slo("ttft_ms=400,tpot_ms=150")).items()
    assert key == ("i256", "r2")
    assert p["ttft_p50_ms"] == pytest.approx(300.0)  # the answered three: 100, 300, 500
    assert p["ttft_p99_ms"] == pytest.approx(496.0)
    assert p["tpot_p50_ms"] == pytest.approx(100.0) and p["tpot_p99_ms"] == pytest.approx(198.0)
    assert p["send_lag_p50_ms"] == pytest.approx(750.0)  # lags 0, 0.5, 1.0, 1.5
    assert p["offered_rps"] == 2.0 and p["achieved_rps"] == pytest.approx(3 / 4.5)
    # within both: request 0 (ttft 100, tpot 100) and 1 (300, 100); 2 misses (500 ms); 3 failed
    assert p["slo"] == "ttft_ms=400,tpot_ms=150"
    assert p["slo_attainment"] == 0.5 and p["goodput_rps"] == pytest.approx(2 / 4.5)
    none = latency_by_point(recs)[("i256", "r2")]
    assert math.isnan(none["slo_attainment"]) and none["slo"] == ""


def _configs():
    p0 = prompt(40)
    recs = [candidate(p0, [65] * 8, concurrency=4, t_start=1.0, e2e=1.0),
            _rate(1, 2.0, 5.0, 5.0, 0.1, 1.0, n=8), _rate(2, 4.0, 9.0, 9.0, 0.2, 2.0, n=8)]
    refs = {r["input_hash"]: r for r in (reference(x["input_ids"], x["output_ids"]) for x in recs)}
    stats = [{"key": "stats/i256-r2/i256-r0", "pool": "i256", "concurrency": None,
              "counters": {"cache_hit_tokens": 7, "checkpoint_evictions": 0, "kv_evicted_pages": 0}}]
    points = [{"pool": "i256", "point": "r4", "warmup": 2, "unsent": 3, "stopped": "reached --duration 5s"}]
    return configs_table(analyze(recs, refs), stats, recs, points, parse_slo("ttft_ms=150"))


def test_configs_have_one_row_per_sweep_point():
    c = _configs()
    assert list(c["point"]) == ["c4", "r2", "r4"]
    assert list(c["concurrency"].astype(object).where(c["concurrency"].notna(), None)) == [4, None, None]
    assert list(c["request_rate"].fillna(-1)) == [-1, 2.0, 4.0] and list(c["requests"]) == [1, 1, 1]
    assert list(c["cache_hit_tokens"]) == ["unknown", 7, "unknown"]
    assert list(c["slo_attainment"]) == [1.0, 1.0, 0.0]
    r4 = c.iloc[2]
    assert (r4["warmup"], r4["unsent"], r4["stopped"]) == (2, 3, "reached --duration 5s")


def test_latency_section_escapes_and_shades_a_point_that_did_not_keep_up(tmp_path):
    c = _configs()
    c.loc[2, "pool"] = "<img src=x onerror=alert(1)>"
    html = latency_section(c, "<img alt=plot>")
    assert "<img src=x" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "SLO: ttft_ms=150." in html and html.endswith("<img alt=plot>")
    # r2: 1 answered over 1 s = 1/s of 2 offered; r4: 0.5/s of 4; c4 offers no rate
    assert html.count('<tr class="warm">') == 2 and html.count('<tr class="">') == 1
    assert latency_section(c.iloc[0:0]) == ("<h2 id=latency>Latency and load</h2>"
                                            "<p>No sweep point recorded timed requests.</p>")


def test_latency_figure_draws_with_and_without_data(tmp_path):
    assert latency_vs_load(_configs(), tmp_path / "a.png").stat().st_size > 10_000
    assert latency_vs_load(pd.DataFrame(), tmp_path / "b.png").stat().st_size > 1_000
