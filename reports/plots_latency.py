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
