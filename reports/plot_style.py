"""Shared drawing helpers of the run's PNG figures (matplotlib, Agg): sizes, colours, empty states."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

HARD, SOFT, DRIFT = "#c62828", "#ef9f27", "#6a1b9a"
DPI = 100


def intervals_of(df: pd.DataFrame) -> list[int]:
    """The track intervals present in a requests frame, sorted."""
    return sorted(int(i) for i in df["interval"].dropna().unique()) if len(df) else []


def empty(ax, message: str) -> None:
    """Draw an empty-state message instead of a plot."""
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=11, color="#555", wrap=True,
            transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def figure(rows: int, cols: int, width: float = 11.0, row_height: float = 3.4):
    """A figure with a rows x cols grid of axes and fixed margins."""
    height = row_height * rows + 0.6
    fig = Figure(figsize=(width, height), dpi=DPI)
    # Fixed margins in inches: a layout engine would triple the drawing time.
    fig.subplots_adjust(left=0.75 / width, right=1 - 0.3 / width, top=1 - 0.75 / height, bottom=0.6 / height,
                        hspace=1.1 / (row_height - 1.1), wspace=0.3 if cols > 1 else 0.2)
    axes = fig.subplots(rows, cols, squeeze=False)
    return fig, axes


def save(fig: Figure, path: Path) -> Path:
    """Write the figure; return its path."""
    fig.savefig(path)
    return path
