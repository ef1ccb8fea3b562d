"""The latency-against-load figure: per pool, TTFT and TPOT (p50, p99) against the achieved request rate of each
sweep point, concurrency points and request-rate points alike, so that a server that cannot keep up shows."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from reports.plot_style import empty, figure, save

PANELS = (("ttft", "TTFT (ms)"), ("ttst", "time to second token (ms)"), ("tpot", "TPOT (ms)"),
          ("e2e", "E2E latency (ms)"))


def latency_vs_load(configs: pd.DataFrame, path: Path) -> Path:
    """One panel per metric; per pool a p50 and a p99 line over its points sorted by achieved req/s, each point
    labelled (`c4`, `r2`); open-loop points are triangles, with their offered rate as a dotted mark."""
    fig, axes = figure(2, 2, row_height=3.4)
    fig.suptitle("Latency vs load (achieved requests / s), per pool", fontweight="bold")
    data = configs.dropna(subset=["achieved_rps"]) if len(configs) and "achieved_rps" in configs else pd.DataFrame()
    for ax, (metric, label) in zip(axes.flat, PANELS, strict=True):
        ax.set_title(label)
        cols = [f"{metric}_p50_ms", f"{metric}_p99_ms"]
        if data.empty or data[cols].isna().all().all():
            empty(ax, f"no {label} data")
            continue
        for i, (pool, g) in enumerate(data.sort_values("achieved_rps").groupby("pool", sort=True)):
            color, rate = f"C{i}", g["request_rate"].notna()
            ax.plot(g["achieved_rps"], g[cols[0]], "-", color=color, label=f"{pool} p50")
            ax.plot(g["achieved_rps"], g[cols[1]], "--", color=color, label=f"{pool} p99")
            for q, col in (("o", cols[0]), ("s", cols[1])):
                ax.scatter(g.loc[~rate, "achieved_rps"], g.loc[~rate, col], marker=q, color=color)
                ax.scatter(g.loc[rate, "achieved_rps"], g.loc[rate, col], marker="^", color=color)
            for _, row in g.iterrows():
                ax.annotate(str(row["point"]), (row["achieved_rps"], row[cols[0]]), fontsize=7,
                            xytext=(3, 3), textcoords="offset points")
        ax.set_ylim(bottom=0)
        ax.set_xlim(left=0)
        ax.set_xlabel("achieved requests / s")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    return save(fig, path)


DISTRIBUTIONS = (("ttft", "TTFT (ms)"), ("itl", "ITL: mean gap per token (ms)"), ("e2e", "E2E latency (ms)"))
MAX_POINTS = 20_000  # per pool and metric: a CDF or a time series drawn from more points looks the same


def _gated(df: pd.DataFrame) -> pd.DataFrame:
    from reports.controls import is_control

    if not len(df) or "pool" not in df:
        return df
    return df[~df["pool"].map(is_control).astype(bool) & df["class"].ne("error")]


def _thin(values: pd.Series) -> pd.Series:
    return values if len(values) <= MAX_POINTS else values.iloc[:: -(-len(values) // MAX_POINTS)]


def latency_over_time(df: pd.DataFrame, path: Path) -> Path:
    """Per gated pool, each request's TTFT and E2E latency against its send time since the run's first request:
    a server that slows down, stalls or recovers during a run shows here, where percentiles hide it."""
    fig, axes = figure(1, 2, row_height=3.6)
    fig.suptitle("Latency over the run, per request", fontweight="bold")
    data = _gated(df)
    for ax, (metric, label) in zip(axes.flat, (("ttft", "TTFT (ms)"), ("e2e", "E2E latency (ms)")), strict=True):
        ax.set_title(label)
        if not len(data) or data[metric].notna().sum() == 0 or data["t_start"].notna().sum() == 0:
            empty(ax, f"no {label} data")
            continue
        t0 = data["t_start"].min()
        for i, (pool, g) in enumerate(data.dropna(subset=[metric, "t_start"]).sort_values("t_start")
                                      .groupby("pool", sort=True)):
            g = _thin(g)
            ax.scatter(g["t_start"] - t0, 1000 * g[metric], s=6, color=f"C{i}", label=str(pool), alpha=0.7)
        ax.set_xlabel("send time since the run's first request (s)")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7, markerscale=2)
    return save(fig, path)


def latency_cdfs(df: pd.DataFrame, path: Path) -> Path:
    """Per gated pool, the distribution (empirical CDF) of TTFT, ITL and E2E latency over its requests, with the
    p50 / p90 / p99 marked: the shape of a tail, which three percentiles cannot show."""
    fig, axes = figure(1, 3, width=13.0, row_height=3.6)
    fig.suptitle("Latency distributions (CDF), per pool", fontweight="bold")
    data = _gated(df)
    for ax, (metric, label) in zip(axes.flat, DISTRIBUTIONS, strict=True):
        ax.set_title(label)
        if not len(data) or data[metric].notna().sum() == 0:
            empty(ax, f"no {label} data")
            continue
        for i, (pool, g) in enumerate(data.groupby("pool", sort=True)):
            values = _thin((1000 * g[metric].dropna()).sort_values().reset_index(drop=True))
            if not len(values):
                continue
            share = (values.index + 1) / len(values)
            ax.step(values, share, where="post", color=f"C{i}", label=str(pool))
            for q in (0.5, 0.9, 0.99):
                ax.axhline(q, color="#bbb", linewidth=0.6, linestyle=":")
        ax.set_xlabel(label)
        ax.set_ylabel("share of requests at or below")
        ax.set_ylim(0, 1.02)
        ax.set_xlim(left=0)
        ax.legend(fontsize=7)
    return save(fig, path)
