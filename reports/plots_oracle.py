"""Figures of the oracle's footing: the drift noise floor beside the tolerance, and the boundary-case coverage."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from reports.coverage import coverage_summary
from reports.oracle import FLAGGED
from reports.plot_style import DRIFT, HARD, empty, figure, save

ZERO_AT = 1e-9  # where a drift of exactly 0 is drawn on the log axis


def drift_floor(df: pd.DataFrame, tolerance: float | None, path: Path) -> Path:
    """Histogram (log x) of the drift of requests that restored nothing (the floor), of the other unflagged
    requests and of the flagged ones, with the tolerance and the 10x warning margin marked."""
    fig, axes = figure(1, 1, row_height=3.8)
    ax = axes[0, 0]
    ax.set_title("Log-prob drift: the observed noise floor beside the tolerance", fontweight="bold")
    measured = df[df["drift"].notna()] if len(df) else df
    if not len(measured):
        empty(ax, "no drift measured (no candidate requests with log-probs on both sides)")
        return save(fig, path)
    values = measured["drift"].astype(float).clip(lower=ZERO_AT)
    flagged = measured["class"].isin(FLAGGED)
    floor = (measured["cached_tokens"] == 0) & ~flagged
    top = max(float(values.max()), tolerance or 0.0, 1.0) * 3
    bins = np.logspace(np.log10(ZERO_AT) - 0.1, np.log10(top), 60)
    series = [("restored nothing: the noise floor", floor, "#757575"),
              ("restored a checkpoint, not flagged", ~floor & ~flagged, "#1e88e5"),
              ("flagged (drift or hard)", flagged, HARD)]
    for label, mask, color in series:
        if mask.any():
            ax.hist(values[mask], bins=bins, histtype="stepfilled", alpha=0.55, color=color,
                    label=f"{label} ({int(mask.sum())})")
    if tolerance:
        ax.axvline(tolerance, color=DRIFT, linewidth=2, label=f"tolerance {tolerance:g}")
        ax.axvline(tolerance / 10, color=DRIFT, linewidth=1, linestyle=":", label="tolerance / 10 (warning)")
    ax.set_xscale("log")
    ax.set_xlabel(f"max |candidate - reference| log-prob over the common prefix (0 drawn at {ZERO_AT:g})")
    ax.set_ylabel("requests")
    ax.legend(fontsize=8, loc="upper center")
    return save(fig, path)


CELL_COLOURS = {"not reached": "#e0e0e0", "reached, all exact": "#66bb6a", "reached, some flagged": "#e57373"}


def _grid(ax, cells: pd.DataFrame, column: str, flagged: str | None, title: str, block: int) -> None:
    """One interval's (step, commit length) cells: grey not reached, green reached and all exact, red reached with
    a flagged request (f/n written in it), hatched where no verify step can hold the boundary; with a legend."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    status = np.full((block, block), np.nan)  # [commit_len - 1, step]: 0 not reached, 1 exact, 2 flagged
    for r in cells.to_dict("records"):
        bad = int(r[flagged]) if flagged else 0
        status[r["commit_len"] - 1, r["step"]] = 0.0 if not r[column] else (2.0 if bad else 1.0)
    extent = (-0.5, block - 0.5, 0.5, block + 0.5)
    impossible = np.fromfunction(lambda c, s: s > c, (block, block))
    ax.imshow(np.where(impossible, 1.0, np.nan), cmap="Greys", vmin=0, vmax=4, origin="lower", aspect="auto",
              extent=extent)
    ax.imshow(status, cmap=ListedColormap(list(CELL_COLOURS.values())), vmin=-0.5, vmax=2.5, origin="lower",
              aspect="auto", extent=extent)
    for r in cells.to_dict("records"):
        if not r[column]:
            continue
        bad = int(r[flagged]) if flagged else 0
        ax.text(r["step"], r["commit_len"], f"{bad}/{int(r[column])}" if flagged else str(int(r[column])),
                ha="center", va="center", fontsize=7, color="black", fontweight="bold" if bad else "normal")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("verify step holding the boundary state")
    ax.set_ylabel("commit length")
    ax.set_xticks(range(block))
    ax.set_yticks(range(1, block + 1))
    legend = [Patch(color=c, label=k) for k, c in CELL_COLOURS.items() if flagged or "flagged" not in k]
    legend.append(Patch(facecolor="#f5f5f5", edgecolor="#999", label="impossible (step > commit length - 1)"))
    ax.legend(handles=legend, fontsize=6, loc="upper left", framealpha=0.9)


def boundary_coverage(coverage: pd.DataFrame | None, path: Path) -> Path:
    """Per interval, the (step, commit length) cells crossed in a verify step and restored by a later turn
    (grey: not reached; green: reached, all exact; red: reached with a flagged request, f/n written)."""
    summary = coverage_summary(coverage) if coverage is not None and len(coverage) else []
    fig, axes = figure(max(1, len(summary)), 2, width=12.0, row_height=3.8)
    fig.suptitle("Boundary-case coverage: (verify step holding the boundary, commit length) cells reached",
                 fontweight="bold")
    if not summary:
        for ax in axes[0]:
            empty(ax, "cells reached: unknown\n(no verify steps reported: no spec_trace in the records)")
        return save(fig, path)
    for row, s in zip(axes, summary, strict=False):
        cells = coverage[coverage["interval"] == s["interval"]]
        block = int(cells["commit_len"].max())
        _grid(row[0], cells, "crossed", None,
              f"interval {s['interval']}: {s['crossed']}/{s['cells']} cells crossed in a verify step", block)
        _grid(row[1], cells, "restored", "restored_flagged",
              f"interval {s['interval']}: {s['restored']}/{s['cells']} cells restored by a later turn", block)
    return save(fig, path)
