"""The results model every output is rendered from, and one-line descriptions of an analyzed request.

`RunResults` is built once per run (reports/render.py); the HTML page, summary.md
and junit.xml each read it and nothing else, so they cannot disagree.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from reports.crossing_cells import crossing_list
from reports.diagnosis import Diagnosis, NoiseFloor
from reports.gate import Verdict


@dataclass
class RunResults:
    """A run's analysis: requests frame, tables, verdict, raw records and what the reader must be warned of."""

    df: pd.DataFrame  # one row per candidate request (reports.analyze.REQUEST_COLUMNS)
    boundaries: pd.DataFrame
    configs: pd.DataFrame
    verdict: Verdict
    config: dict  # the run's config.json
    records: dict[str, dict]  # candidate key -> its whole record, of the worst cases (reports/render.py)
    references: dict[str, dict]  # input_hash -> reference record, of the worst cases
    coverage: pd.DataFrame
    tree_shapes: pd.DataFrame  # interval x tree shape (reports/tree_shapes.py)
    diagnosis: Diagnosis
    floor: NoiseFloor
    plots: dict[str, Path] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    judged: pd.DataFrame | None = None  # the frame as the verdict judged it (path numerics apart), for its counts
    cache_lost: Counter = field(default_factory=Counter)  # candidate turns per `cache_lost` cause (incidents.py)

    @property
    def run_id(self) -> str:
        return str(self.config.get("run_id", ""))


def value_or_none(value):
    """None for pandas/NumPy missing values, else the value."""
    try:
        return None if pd.isna(value) else value
    except (TypeError, ValueError):  # lists and other non-scalars are never missing
        return value


def signed(n: int) -> str:
    return f"{n:+d}"


def drift_text(row: dict) -> str:
    """The log-prob drift, e.g. `drift 0.31 from output index 0 (sequence position 270, +14 from ...)`."""
    drift = value_or_none(row.get("drift"))
    if drift is None:
        return "drift not measured (no log-probs): margin rule only"
    onset = value_or_none(row.get("drift_onset"))
    if onset is None:
        return f"max log-prob drift {drift:.3g} (within the tolerance)"
    text = f"log-prob drift {drift:.3g}, from output index {onset} (sequence position {row['drift_onset_pos']}"
    off = value_or_none(row.get("drift_onset_offset"))
    if off is not None:
        text += f", {signed(off)} from the nearest multiple of {row['interval']}"
    where = value_or_none(row.get("onset_points_at"))
    return text + ")" + (f": points at the {where.replace('_', ' ')}" if where else "")


def divergence_text(row: dict) -> str:
    """Where the candidate first left the reference, e.g. `output index 2 (sequence 282, +26 from a boundary)`."""
    p = value_or_none(row.get("first_divergence"))
    if p is None:
        return "no divergence"
    text = f"output index {p} (sequence position {row['divergence_pos']}"
    off = value_or_none(row.get("divergence_offset"))
    if off is not None:
        text += f", {signed(off)} from the nearest multiple of {row['interval']}"
    text += ")"
    cand, ref = value_or_none(row.get("cand_token")), value_or_none(row.get("ref_token"))
    if cand is not None or ref is not None:
        text += f": candidate token {cand}, reference token {ref}"
    margin = value_or_none(row.get("ref_margin"))
    if margin is not None:
        text += f", reference top-1/top-2 margin {margin:.4g}"
    rank = value_or_none(row.get("cand_rank"))
    text += f", candidate token rank {rank} in the reference top-k" if rank is not None else ""
    return text


def crossing_text(x: dict) -> str:
    """One crossing, e.g. `256 (step 1 of commit 2, tracked -1: NOT tracked)`."""
    if x["source"] != "reported":
        return f"{x['boundary']} (inferred from positions; verify step unknown)"
    state = "tracked" if x["tracked_agrees"] else "NOT tracked"
    return f"{x['boundary']} (pre {x['pre_len']}, step {x['step']} of commit {x['commit_len']}, " \
           f"engine tracked step {x['tracked']}: {state})"


def attribution_text(row: dict) -> str:
    """Restored checkpoint, previous-turn link, verify crossings and prompt offset in one line."""
    parts = []
    cached = value_or_none(row.get("cached_tokens")) or 0
    if cached > 0:
        text = f"restored checkpoint at {cached} ({row['input_len'] - cached} tokens prefilled after it)"
        if row.get("restored_verify_crossed"):
            tracked = value_or_none(row.get("restored_crossing_tracked"))
            how = "tracked" if tracked else "NOT tracked"
            text += (f", crossed by turn {row['turn'] - 1}'s verify step {row['restored_crossing_step']} "
                     f"of commit {row['restored_crossing_commit_len']} ({how})")
        elif row.get("restored_link") == "position":
            text += (f", a checkpoint turn {row['turn'] - 1} crossed (position-linked; which verify step: unknown, "
                     "the engine does not report verify steps)")
        elif row.get("restored_link") == "prefill":
            text += f", a checkpoint turn {row['turn'] - 1}'s prefill took (64-token grid)"
        parts.append(text)
    else:
        parts.append("no checkpoint restored")
    crossings = crossing_list(row.get("crossings"))
    if crossings:
        parts.append("this turn crossed " + "; ".join(crossing_text(x) for x in crossings))
    elif row.get("crossing_source") == "reported":
        parts.append("this turn's own verify steps crossed no boundary")
    elif row.get("crossing_source") == "inferred":
        parts.append("this turn crossed no boundary while decoding (from positions; the engine does not report "
                     "verify steps)")
    off = value_or_none(row.get("prompt_offset"))
    if off is not None:
        parts.append(f"prompt {row['input_len']} tokens = {signed(off)} from the nearest multiple of "
                     f"{row['interval']}")
    return "; ".join(parts)


def case_text(row: dict) -> str:
    """Class, detail, divergence and attribution of one request."""
    if row["class"] == "error":
        return f"turn {row['turn']}: error ({row['detail']}); {attribution_text(row)}"
    if row["class"] == "drift":
        return f"turn {row['turn']}: drift, same tokens, {drift_text(row)}; {attribution_text(row)}"
    return (f"turn {row['turn']}: {row['class']} ({row['detail']}) at {divergence_text(row)}; "
            f"{drift_text(row)}; {attribution_text(row)}")
