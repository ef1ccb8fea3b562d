"""The report's "Latency and load" section: per sweep point, the latency percentiles, offered vs achieved rate,
SLO attainment and goodput, warmup and early stops (reports/latency.py, configs.csv), and the latency-vs-load
figure."""

from __future__ import annotations

import pandas as pd

from reports.html_base import esc, table

COLUMNS = ["pool", "point", "requests", "offered_rps", "achieved_rps", "send_lag_p99_ms",
           *(f"{m}_{q}_ms" for m in ("ttft", "ttst", "itl", "tpot", "e2e") for q in ("p50", "p90", "p95", "p99")),
           "slo_attainment", "goodput_rps", "warmup", "unsent", "stopped"]


def _lagging(row: dict) -> str:
    """A rate point whose server did not keep up (achieved < 90% of offered) is shaded."""
    offered, achieved = row.get("offered_rps"), row.get("achieved_rps")
    ok = pd.notna(offered) and pd.notna(achieved)
    return "warm" if ok and achieved < 0.9 * offered else ""


def latency_section(configs: pd.DataFrame, plot_html: str = "") -> str:
    """The section's HTML (every value escaped); `plot_html`: the figures (latency over the run, its
    distributions, latency against load)."""
    head = "<h2 id=latency>Latency and load</h2>"
    if not len(configs) or "achieved_rps" not in configs:
        return head + "<p>No sweep point recorded timed requests.</p>"
    slo = next((s for s in configs.get("slo", pd.Series(dtype=str)).fillna("") if s), "")
    intro = ("<p>Per sweep point (c = concurrency, r = requests per second): latency percentiles of the gated "
             "requests (warmup excluded), the offered and the achieved rate (answered requests over the point's "
             "wall span: a rate point shaded here achieved under 90% of what it offered), and the send lag "
             "(actual minus planned send time). ITL is each request's mean gap per token; time to second token "
             "can equal TTFT where one chunk carries several tokens.")
    intro += f" SLO: {esc(slo)}.</p>" if slo else " No --slo was given.</p>"
    cols = [c for c in COLUMNS if c in configs.columns]
    return head + intro + table(configs[cols], left=("pool", "point", "stopped"), row_class=_lagging) + plot_html
