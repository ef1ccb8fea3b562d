"""PNG figures of a run (matplotlib, Agg). Every figure draws an empty-state message instead of failing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.ticker import ScalarFormatter

from reports.plot_style import DRIFT, HARD, SOFT
from reports.plot_style import empty as _empty
from reports.plot_style import figure as _figure
from reports.plot_style import intervals_of as _intervals
from reports.plot_style import save as _save
from reports.plots_latency import latency_cdfs, latency_over_time, latency_vs_load
from reports.plots_oracle import boundary_coverage, drift_floor

PLOT_FILES = {
    "mismatch_rate": "mismatch_rate_by_prompt_offset.png",
    "verify_heatmap": "flagged_by_verify_step.png",
    "divergence": "divergence_offset.png",
    "drift_floor": "drift_floor.png",
    "coverage": "boundary_coverage.png",
    "accept_length": "accept_length.png",
    "performance": "throughput_latency.png",
    "latency_load": "latency_vs_load.png",
    "latency_time": "latency_over_time.png",
    "latency_cdf": "latency_cdf.png",
}


def mismatch_rate_by_prompt_offset(df: pd.DataFrame, path: Path) -> Path:
    """Hard, drift and soft rate by the prompt's offset to its nearest boundary, one panel per interval."""
    intervals = _intervals(df)
    fig, axes = _figure(max(1, len(intervals)), 1)
    fig.suptitle("Mismatch rate by prompt offset to the nearest checkpoint boundary", fontweight="bold")
    if not intervals:
        _empty(axes[0, 0], "no candidate requests with a track interval")
        return _save(fig, path)
    for ax, interval in zip(axes[:, 0], intervals, strict=False):
        g = df[(df["interval"] == interval) & df["prompt_offset"].notna()]
        offsets = g["prompt_offset"].astype(int)
        width = 1
        if offsets.nunique() > 64:  # a load suite spreads prompts over the whole interval: bin them
            width = max(1, interval // 32)
            offsets = offsets // width * width
        by = pd.DataFrame({"x": offsets, "hard": g["class"] == "hard", "drift": g["class"] == "drift",
                           "soft": g["class"] == "soft"})
        rates = by.groupby("x").agg(hard=("hard", "mean"), drift=("drift", "mean"), soft=("soft", "mean"),
                                    n=("hard", "size"))
        bar = 0.3 * width
        ax.bar(rates.index - bar, rates["hard"], width=bar, color=HARD, label="hard")
        ax.bar(rates.index, rates["drift"], width=bar, color=DRIFT, label="drift")
        ax.bar(rates.index + bar, rates["soft"], width=bar, color=SOFT, label="soft")
        ax.scatter(rates.index, np.zeros(len(rates)), marker="|", s=120, color="#555", label="offset tested")
        if len(rates) <= 24:
            for x, n in zip(rates.index, rates["n"], strict=False):
                ax.text(x, 1.07, f"n={n}", ha="center", fontsize=7, color="#555")
        ax.axvline(0, color="#888", linestyle="--", linewidth=1)
        ax.set_ylim(0, 1.12)
        binned = f" (bins of {width})" if width > 1 else ""
        ax.set_title(f"interval {interval}: {len(g)} requests", loc="left")
        ax.set_xlabel(f"prompt length - nearest multiple of {interval} (tokens){binned}")
        ax.set_ylabel("share of requests")
        ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=4, frameon=False, fontsize=9)
        if not (by["hard"].any() or by["drift"].any() or by["soft"].any()):
            ax.text(0.5, 0.6, "no hard, drift or soft requests", ha="center", transform=ax.transAxes,
                    color="#2e7d32", fontsize=12)
    return _save(fig, path)


def _heatmap(ax, rows: pd.DataFrame, empty_message: str, title: str, block_size: int | None) -> None:
    ax.set_title(title, fontsize=10)
    if rows.empty:
        _empty(ax, empty_message)
        return
    steps = rows["offset"].astype(int)
    commits = rows["commit_len"].astype(int)
    n = max(int(steps.max()) + 1, int(commits.max()), block_size or 0)  # steps 0..n-1, commit lengths 1..n
    hard = np.zeros((n, n))  # [commit_len - 1, step]
    total = np.zeros((n, n))
    for s, c, h, k in zip(steps, commits, rows["hard"] + rows["drift"], rows["requests"], strict=False):
        hard[c - 1, s] += h
        total[c - 1, s] += k
    extent = (-0.5, n - 0.5, 0.5, n + 0.5)
    impossible = np.fromfunction(lambda c, s: s > c, (n, n))  # the boundary step lies in the accepted part
    ax.imshow(np.where(impossible, 1.0, np.nan), cmap="Greys", vmin=0, vmax=4, origin="lower", aspect="auto",
              extent=extent)
    rate = np.divide(hard, total, out=np.full_like(hard, np.nan), where=total > 0)
    image = ax.imshow(rate, cmap="Reds", origin="lower", aspect="auto", vmin=0, vmax=1, extent=extent)
    for c in range(n):
        for s in range(n):
            if total[c, s]:
                color = "white" if rate[c, s] > 0.5 else "black"
                ax.text(s, c + 1, f"{int(hard[c, s])}/{int(total[c, s])}", ha="center", va="center",
                        fontsize=8, color=color, fontweight="bold")
    ax.set_xlabel("verify step holding the boundary state (boundary - pre_len - 1)")
    ax.set_ylabel("commit length")
    ax.set_xticks(range(n))
    ax.set_yticks(range(1, n + 1))
    ax.figure.colorbar(image, ax=ax, label="flagged (hard + drift) share")


def _restored_empty(reported: bool, unreported: bool, linked: int) -> str:
    """What an empty restored-crossing heatmap means: "unknown" where verify steps were not reported, never "no"."""
    if unreported and not reported:
        return (f"unknown: verify steps not reported (no spec_trace)\n{linked} restored turn(s) position-linked to "
                "a crossing\nof the previous turn (boundaries.csv: restored_position)")
    return "no restored checkpoint was crossed\nin a verify step of the previous turn"


def flagged_by_verify_step(boundaries: pd.DataFrame, path: Path, block_size: int | None = None) -> Path:
    """Heatmaps step x commit length of flagged requests (colour: hard + drift share; text: flagged / requests).

    Left: the request's own verify crossings. Right: the verify crossing (previous turn) of the checkpoint the
    request restored -- where #37817-like bugs show, since the request that crossed is not the one that suffers.
    """
    intervals = sorted(int(i) for i in boundaries["interval"].dropna().unique()) if len(boundaries) else []
    fig, axes = _figure(max(1, len(intervals)), 2, width=12.0, row_height=3.8)
    fig.suptitle("Flagged requests (hard + drift) by the verify step that crossed a boundary (cell: flagged / "
                 "requests)",
                 fontweight="bold")
    if not intervals:
        for ax in axes[0]:
            _empty(ax, "no boundary attributions")
        return _save(fig, path)
    for row, interval in zip(axes, intervals, strict=False):
        b = boundaries[boundaries["interval"] == interval]
        own = b[b["boundary_kind"] == "crossed_verify"].dropna(subset=["offset", "commit_len"])
        restored = b[b["boundary_kind"] == "restored_verify"].dropna(subset=["offset", "commit_len"])
        reported = bool((b["boundary_kind"] == "crossed_verify").any())
        linked = int(b.loc[b["boundary_kind"] == "restored_position", "requests"].sum())
        unreported = bool((b["boundary_kind"] == "crossed_inferred").any()) or linked > 0
        _heatmap(row[0], own, "unknown: verify steps not reported\n(no spec_trace in the records)" if unreported
                 else "no boundary crossed in a verify step",
                 f"interval {interval}: requests whose own verify step crossed a boundary", block_size)
        _heatmap(row[1], restored, _restored_empty(reported, unreported, linked),
                 f"interval {interval}: requests that restored a checkpoint\ncrossed in the previous turn's verify",
                 block_size)
    return _save(fig, path)


def divergence_offset(df: pd.DataFrame, path: Path) -> Path:
    """Histogram of the first divergence's (hard, soft) and the drift onset's offset to the nearest boundary."""
    intervals = _intervals(df)
    fig, axes = _figure(max(1, len(intervals)), 1)
    fig.suptitle("First divergence and drift onset relative to the nearest checkpoint boundary",
                 fontweight="bold")
    if not intervals:
        _empty(axes[0, 0], "no candidate requests with a track interval")
        return _save(fig, path)
    for ax, interval in zip(axes[:, 0], intervals, strict=False):
        g = df[(df["interval"] == interval) & df["divergence_offset"].notna()]
        ax.set_title(f"interval {interval}")
        if g.empty and not df.loc[df["interval"] == interval, "drift_onset"].notna().any():
            _empty(ax, f"interval {interval}: no divergences and no drift (every answered request matched its "
                       "reference)")
            continue
        bins = np.arange(-(interval // 2), interval // 2 + 2) - 0.5
        onsets = df.loc[(df["interval"] == interval) & df["drift_onset_offset"].notna(), "drift_onset_offset"]
        ax.hist(onsets.astype(int), bins=bins, histtype="step", linewidth=2, color=DRIFT,
                label=f"drift onset ({len(onsets)})")
        for cls, color in (("hard", HARD), ("soft", SOFT)):
            values = g.loc[g["class"] == cls, "divergence_offset"].astype(int)
            ax.hist(values, bins=bins, histtype="stepfilled", color=color, alpha=0.6, label=f"{cls} ({len(values)})")
        ax.axvline(0, color="#888", linestyle="--", linewidth=1)
        ax.set_xlabel(f"divergence position - nearest multiple of {interval} (tokens)")
        ax.set_ylabel("requests")
        ax.legend(loc="upper right")
    return _save(fig, path)


def accept_length(df: pd.DataFrame, path: Path) -> Path:
    """Histogram of per-request mean accept length (completion tokens / verify steps), per interval."""
    fig, axes = _figure(1, 1, row_height=3.6)
    ax = axes[0, 0]
    ax.set_title("Speculative accept length per request", fontweight="bold")
    spec = df[df["spec_accept_length"].notna()] if len(df) else df
    if spec.empty:
        _empty(ax, "no speculative decoding data (spec_accept_length is empty)")
        return _save(fig, path)
    values = spec["spec_accept_length"].astype(float)
    bins = np.linspace(min(1.0, values.min()), max(values.max(), 1.0) + 1e-9, 25)
    for interval, g in spec.groupby("interval", dropna=False):
        label = f"interval {int(interval)}" if pd.notna(interval) else "no interval"
        ax.hist(g["spec_accept_length"].astype(float), bins=bins, histtype="step", linewidth=2,
                label=f"{label} (mean {g['spec_accept_length'].mean():.2f})")
    ax.set_xlabel("accept length (completion tokens / verify steps)")
    ax.set_ylabel("requests")
    ax.legend()
    return _save(fig, path)


def throughput_latency(configs: pd.DataFrame, path: Path) -> Path:
    """Output tok/s and TTFT / ITL / E2E p50 and p99 against concurrency, one line per interval."""
    fig, axes = _figure(2, 2, row_height=3.4)
    fig.suptitle("Throughput and latency vs concurrency", fontweight="bold")
    panels = [("output_tok_s", "output tokens / s", None), ("ttft", "TTFT (ms)", "ttft"),
              ("itl", "mean ITL (ms)", "itl"), ("e2e", "E2E latency (ms)", "e2e")]
    data = configs.dropna(subset=["concurrency"]) if len(configs) else configs
    for ax, (col, label, metric) in zip(axes.flat, panels, strict=False):
        ax.set_title(label)
        cols = [col] if metric is None else [f"{metric}_p50_ms", f"{metric}_p99_ms"]
        if data.empty or data[cols].isna().all().all():
            _empty(ax, f"no {label} data")
            continue
        for i, (pool, g) in enumerate(data.sort_values("concurrency").groupby("pool", sort=True)):
            color = f"C{i}"
            x = g["concurrency"].astype(int)
            if metric is None:
                ax.plot(x, g[col], "o-", color=color, label=str(pool))
            else:
                ax.plot(x, g[cols[0]], "o-", color=color, label=f"{pool} p50")
                ax.plot(x, g[cols[1]], "s--", color=color, label=f"{pool} p99")
        ax.set_ylim(bottom=0)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(data["concurrency"].astype(int).unique()))
        ax.get_xaxis().set_major_formatter(ScalarFormatter())
        ax.set_xlabel("concurrency")
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    return _save(fig, path)


# the requests frame's columns the figures read
PLOT_COLUMNS = ["pool", "class", "interval", "concurrency", "block_size", "prompt_offset", "divergence_offset",
                "drift_onset", "drift_onset_offset", "drift", "cached_tokens", "spec_accept_length", "t_start", "ttft",
                "itl", "e2e", "error"]


def write_plots(df: pd.DataFrame, boundaries: pd.DataFrame, configs: pd.DataFrame, out_dir: str | Path,
                coverage: pd.DataFrame | None = None, tolerance: float | None = None) -> dict[str, Path]:
    """Draw every figure into `out_dir` (created); return name -> path."""
    out = Path(out_dir)
    df = df[[c for c in PLOT_COLUMNS if c in df]]  # a figure's row selections copy these columns, not all 60
    sizes = df["block_size"].dropna() if len(df) else []
    block_size = int(sizes.max()) if len(sizes) else None
    out.mkdir(parents=True, exist_ok=True)
    return {
        "mismatch_rate": mismatch_rate_by_prompt_offset(df, out / PLOT_FILES["mismatch_rate"]),
        "verify_heatmap": flagged_by_verify_step(boundaries, out / PLOT_FILES["verify_heatmap"], block_size),
        "divergence": divergence_offset(df, out / PLOT_FILES["divergence"]),
        "drift_floor": drift_floor(df, tolerance, out / PLOT_FILES["drift_floor"]),
        "coverage": boundary_coverage(coverage, out / PLOT_FILES["coverage"]),
        "accept_length": accept_length(df, out / PLOT_FILES["accept_length"]),
        "performance": throughput_latency(configs, out / PLOT_FILES["performance"]),
        "latency_load": latency_vs_load(configs, out / PLOT_FILES["latency_load"]),
        "latency_time": latency_over_time(df, out / PLOT_FILES["latency_time"]),
        "latency_cdf": latency_cdfs(df, out / PLOT_FILES["latency_cdf"]),
    }
