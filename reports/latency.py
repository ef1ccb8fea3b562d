"""Latency per sweep point, as load testers report it: percentiles, SLO attainment, goodput, offered vs achieved.

Per gated candidate request (warmup requests are not candidates): TTFT (first token), TTST (second token:
under DFlash one chunk can carry several tokens, so it can equal TTFT), ITL (the request's mean gap per token
between its first and last token chunk: records hold no per-chunk times), TPOT ((E2E - TTFT) / (tokens - 1)),
E2E, and the send lag (actual minus planned send time: an open-loop request waits for its session's previous
turn). Per sweep point: p50/p90/p95/p99 of each, the offered rate (`--request-rate`; none for a concurrency
point), the achieved rate (answered requests over the point's wall span), and with `--slo` the attainment
(the share of the point's requests that answered within every objective) and goodput (those per second).
docs/load.md gives the columns. Pure functions over records.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import pandas as pd

from records.schema import point_label

QUANTILES = (50, 90, 95, 99)
METRICS = ("ttft", "ttst", "itl", "tpot", "e2e")
SLO_METRICS = {f"{m}_ms": m for m in METRICS}  # --slo keys -> per-request metric (seconds)
LATENCY_COLUMNS = [f"{m}_p{q}_ms" for m in METRICS for q in QUANTILES] + [
    "send_lag_p50_ms", "send_lag_p99_ms", "offered_rps", "achieved_rps", "slo", "slo_attainment", "goodput_rps"]


def parse_slo(text: str | None) -> dict[str, float]:
    """`'ttft_ms=500,tpot_ms=50'` -> {'ttft': 0.5, 'tpot': 0.05} (seconds); ValueError names --slo."""
    out: dict[str, float] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, _, value = item.partition("=")
        name = name.strip()
        if name not in SLO_METRICS:
            raise ValueError(f"--slo: unknown objective {name!r}; use {', '.join(SLO_METRICS)} (milliseconds), "
                             "e.g. 'ttft_ms=500,tpot_ms=50'")
        try:
            ms = float(value)
        except ValueError:
            raise ValueError(f"--slo: {name} needs a number of milliseconds, got {value.strip()!r}") from None
        if not ms > 0 or math.isinf(ms):
            raise ValueError(f"--slo: {name} must be > 0 ms, got {value.strip()}")
        out[SLO_METRICS[name]] = ms / 1000.0
    return out


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v) else None


def request_latency(records: Iterable[dict]) -> pd.DataFrame:
    """One row per candidate record: pool, point (`c4`, `r2`), error, each metric in seconds (NaN: unknown)."""
    rows = []
    for r in records:
        ttft, e2e, n = _num(r.get("ttft")), _num(r.get("e2e")), int(_num(r.get("completion_tokens")) or 0)
        start, planned = _num(r.get("t_start")), _num(r.get("t_planned"))
        failed = r.get("error") is not None and not (isinstance(r.get("error"), float) and math.isnan(r["error"]))
        rows.append({"pool": r.get("pool"), "point": point_label(r) or f"c{r.get('concurrency')}",
                     "failed": failed, "ttft": ttft, "ttst": _num(r.get("ttst")), "itl": _num(r.get("itl")),
                     "tpot": (e2e - ttft) / (n - 1) if e2e is not None and ttft is not None and n > 1 else None,
                     "e2e": e2e, "t_start": start,
                     "t_end": start + e2e if start is not None and e2e is not None else None,
                     "lag": start - planned if start is not None and planned is not None else None,
                     "rate": _num(r.get("request_rate"))})
    floats = (*METRICS, "t_start", "t_end", "lag", "rate")
    return pd.DataFrame(rows, columns=["pool", "point", "failed", *floats]).astype(dict.fromkeys(floats, float))


def _pct_ms(values: pd.Series, q: float) -> float:
    v = values.dropna()
    return float(np.percentile(v, q) * 1000.0) if len(v) else np.nan


def meets(row: dict, slo: dict[str, float]) -> bool:
    """An answered request within every objective (a metric it has no value for, e.g. the TPOT of a one-token
    answer, does not count against it); a failed request meets none."""
    return not row["failed"] and all(not (row[m] > limit) for m, limit in slo.items())


def point_latency(g: pd.DataFrame, slo: dict[str, float]) -> dict:
    """The latency columns (LATENCY_COLUMNS) of one sweep point's request rows (request_latency)."""
    ok = g[~g["failed"]]
    out = {f"{m}_p{q}_ms": _pct_ms(ok[m], q) for m in METRICS for q in QUANTILES}
    out["send_lag_p50_ms"], out["send_lag_p99_ms"] = _pct_ms(g["lag"], 50), _pct_ms(g["lag"], 99)
    wall = g["t_end"].max() - g["t_start"].min() if g["t_end"].notna().any() else np.nan
    rates = g["rate"].dropna()
    out["offered_rps"] = float(rates.iloc[0]) if len(rates) else np.nan  # a concurrency point offers no rate
    out["achieved_rps"] = len(ok) / wall if wall and wall > 0 else np.nan
    out["slo"] = ",".join(f"{m}_ms={v * 1000:g}" for m, v in slo.items()) if slo else ""
    if slo and len(g):
        met = sum(meets(row, slo) for row in g.to_dict("records"))
        out["slo_attainment"] = met / len(g)
        out["goodput_rps"] = met / wall if wall and wall > 0 else np.nan
    else:
        out["slo_attainment"] = out["goodput_rps"] = np.nan
    return out


def latency_by_point(records: Iterable[dict], slo: dict[str, float] | None = None) -> dict[tuple[str, str], dict]:
    """(pool, point label) -> point_latency of its candidate records."""
    return latency_of_points(request_latency(records), slo)


def latency_of_points(lat: pd.DataFrame, slo: dict[str, float] | None = None) -> dict[tuple[str, str], dict]:
    """(pool, point label) -> point_latency of its rows of `lat` (request_latency's frame)."""
    return {(pool, point): point_latency(g, slo or {})
            for (pool, point), g in lat.groupby(["pool", "point"], sort=True)}


def empty_latency() -> dict:
    """The latency columns of a point without timed requests."""
    return {c: ("" if c == "slo" else np.nan) for c in LATENCY_COLUMNS}
