"""The restore window check: a restored turn's prompt tokens past its checkpoint, candidate against the reference.

A turn that resumed from a checkpoint at b prefilled its prompt tokens from b on with the restored linear state;
the harness's probe (harness/window.py) scored the tokens b+1 .. len-1 on the candidate (restoring the same
checkpoint) and on the cold reference, both through a prefill. A wrong state moves those log-probs from the first
tokens past b, before anything else could (measured on the built-in engine in bf16, I = 128: by 0.4 to 6 for
`track-off-by-one`, against at most 0.09 for clean restores), while the turn's output tokens come after the whole
suffix, where the error has partly decayed and verify numerics move log-probs as much (DESIGN.md 3.3). So the
window has its own limits: the window tolerance (the largest |difference| at any window token) and the window
envelope (the difference summed over the first n window tokens, reports/envelope.py's ladder), calibrated from
the controls' own windows where the run is calibrated (harness/calibrate.py: a clean cache-only control restores
checkpoints through the same prefill path), else the run's drift tolerance alone. A restored turn whose window
passes them left the reference before its first output token: drift (or, with a later flip, hard), attributed
to the restored checkpoint, whatever its outputs show.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from reports.envelope import Envelope, ladder_sums
from reports.frame_rows import ROWS, records

WINDOW_LISTS = ("window_logprobs", "window_ref_logprobs")  # the probe's token lists (harness/window.py)
WINDOW_DETAIL = "prompt log-prob drift"  # the start of a window flag's detail


@dataclass(frozen=True, eq=False)
class WindowFact:
    """One restored turn's compared window: its checkpoint `start` and the |candidate - reference| log-prob of
    each window token compared (window index i = prompt token start + 1 + i)."""

    start: int
    diffs: np.ndarray  # [n] float32: held for every probed turn of a run, so half the bytes of float64

    @property
    def n(self) -> int:
        return len(self.diffs)

    @property
    def drift(self) -> float:
        """The largest difference."""
        return float(self.diffs.max())

    @property
    def sums(self) -> tuple[float, ...]:
        """The ladder sums of the differences (reports/envelope.py)."""
        return ladder_sums(self.diffs.tolist())

    def position(self, i: int) -> int:
        """The prompt position of window index i."""
        return self.start + 1 + i


def window_diffs(rec: Mapping) -> list[float] | str | None:
    """|candidate - reference| log-prob of each window token a record's probe scored on both sides; a string
    saying why the window cannot be compared (the probe failed, or restored another checkpoint than the turn);
    None for a record with no probe."""
    start = rec.get("window_start")
    if start is None:
        return None
    if rec.get("window_error"):
        return f"probe failed: {rec['window_error']}"
    cached = rec.get("window_cached_tokens")
    if cached != start:
        return f"the probe restored {cached} tokens, not the turn's {start}: the checkpoint changed in between"
    cand, ref = rec.get("window_logprobs"), rec.get("window_ref_logprobs")
    if not isinstance(cand, list) or not isinstance(ref, list) or len(cand) != len(ref):
        return "the probe's two sides scored different token counts"
    # a token one side did not score counts as unmoved, so that index i stays prompt token start + 1 + i
    return [abs(float(a) - float(b)) if a is not None and b is not None else 0.0 for a, b in zip(cand, ref,
                                                                                                  strict=True)]


def window_fact(rec: Mapping) -> WindowFact | str | None:
    """The record's WindowFact (window_diffs' string or None where there is none)."""
    diffs = window_diffs(rec)
    if not isinstance(diffs, list):
        return diffs
    if not diffs or not any(a is not None and b is not None for a, b in zip(rec["window_logprobs"],
                                                                            rec["window_ref_logprobs"], strict=True)):
        return "no window token was scored on both sides"
    return WindowFact(int(rec["window_start"]), np.asarray(diffs, dtype=np.float32))


@dataclass(frozen=True)
class WindowLimits:
    """What a pool's windows may show: the tolerance at any token, and (calibrated runs) the envelope."""

    tolerance: float
    envelope: Envelope | None = None


def window_flag(fact: WindowFact, limits: WindowLimits) -> tuple[int, str] | None:
    """(window index where it first passed, the detail) if the window passes its limits, else None."""
    above = np.flatnonzero(fact.diffs > limits.tolerance)
    over = int(above[0]) if len(above) else None
    env = limits.envelope.onset(fact.diffs.tolist()) if limits.envelope is not None else None
    if over is None and env is None:
        return None
    if env is None or (over is not None and over <= env[0]):
        pos = fact.position(over)
        return over, (f"{WINDOW_DETAIL} {fact.diffs[over]:.3g} at prompt token {pos} ({pos - fact.start} past the "
                      f"restored checkpoint {fact.start}) > window tolerance {limits.tolerance:.3g}")
    i, total, limit = env
    return i, (f"{WINDOW_DETAIL} summed over prompt tokens {fact.start + 1}-{fact.position(i)} past the restored "
               f"checkpoint {fact.start}: {total:.3g} > the path's window envelope {limit:.3g} there")


WINDOW_COLUMNS = ("window_start", "window_len", "window_drift", "window_onset_pos", "window_status")


def with_windows(df: pd.DataFrame, facts, limits: Mapping[str, WindowLimits], default: WindowLimits
                 ) -> pd.DataFrame:
    """`df` with the window columns (WINDOW_COLUMNS) and its restored rows whose window passes their pool's limits
    (`limits`, else `default`) flagged: exact becomes drift, soft becomes hard (drift before the flip), detail
    the window's (a row its outputs flagged keeps their detail); `onset_points_at` the restored checkpoint.
    `facts`: the run's TokenFacts (reports/facts.py: per candidate its WindowFact, or why a probed turn's window
    was not compared). Idempotent."""
    if not len(df):
        return df.assign(**{c: pd.Series(dtype=object) for c in WINDOW_COLUMNS})
    cols: dict[str, list] = {c: [None] * len(df) for c in WINDOW_COLUMNS}
    flagged: dict[str, dict[int, str]] = {"class": {}, "detail": {}, "onset_points_at": {}}  # position -> value
    rows = facts.rows(df["key"])
    probed = np.flatnonzero(facts.probed(rows))  # positions: the rows with a window, compared or not
    for start in range(0, len(probed), ROWS):
        at = probed[start:start + ROWS]
        part = df.iloc[at]
        for p, row, fact in zip(at.tolist(), records(part, ["pool", "class", "detail"]), facts.windows_at(rows[at]),
                                strict=True):
            if isinstance(fact, str):
                cols["window_status"][p] = f"not compared: {fact}"
                continue
            cols["window_start"][p], cols["window_len"][p], cols["window_drift"][p] = fact.start, fact.n, fact.drift
            flag = window_flag(fact, limits.get(str(row["pool"]), default))
            cols["window_status"][p] = "compared"
            if flag is not None:  # the state was wrong from the restore, whatever the outputs showed later
                cols["window_status"][p], cols["window_onset_pos"][p] = "flagged", fact.position(flag[0])
                flagged["onset_points_at"][p] = "restored_checkpoint"
                if row["class"] in ("exact", "soft"):
                    flagged["class"][p] = "drift" if row["class"] == "exact" else "hard"
                    flagged["detail"][p] = flag[1]
    out = df.assign(**{c: pd.Series(v, index=df.index, dtype=object) for c, v in cols.items()})
    for column, values in flagged.items():
        if values:  # the flagged rows' values, the column's own type kept elsewhere
            mask = np.zeros(len(df), dtype=bool)
            mask[list(values)] = True
            other = np.empty(len(df), dtype=object)
            other[list(values)] = list(values.values())
            out[column] = out[column].where(~mask, pd.Series(other, index=df.index))
    return out


OPENAI_UNPROBED = ("the OpenAI protocol cannot score a prompt without changing what the server caches (vLLM serves a "
                   "request asking for prompt log-probs uncached), so no probe is sent")


def unprobed_reason(config: Mapping) -> str:
    """Why a run's restored turns have no restore window, from its config.json: what the run's target said when
    it started (`target.window_unprobed`), else, for a run written before it said so, its settings (under
    `run_config`)."""
    facts = config.get("target")
    if isinstance(facts, Mapping) and "window_unprobed" in facts:
        return facts["window_unprobed"] or "no probe answered"
    settings = {**config, **(config.get("run_config") or {})}
    if settings.get("no_restore_window"):
        return "--no-restore-window"
    if settings.get("backend") == "openai":  # a run of vLLM's target too: it speaks the OpenAI protocol
        return OPENAI_UNPROBED
    return "no probe answered (or a run from before the probe)"


WINDOW_READS = ["pool", "restored", "window_status"]  # the columns window_lines reads


def window_lines(df: pd.DataFrame, unprobed: str) -> list[str]:
    """What the restore windows showed, one line per pool that restored a checkpoint: compared, flagged, not
    compared (why); `unprobed`: why a pool with no window at all has none (unprobed_reason)."""
    if "window_status" not in df or not len(df):
        return []
    out = []
    for pool, g in df[df["restored"].astype(bool)].groupby("pool", sort=True):
        status = g["window_status"]
        if status.isna().all():
            out.append(f"pool {pool}: no restore window compared ({len(g)} restored turn(s) judged on their outputs "
                       f"alone: {unprobed})")
            continue
        compared = int(status.isin(["compared", "flagged"]).sum())
        missing = status[status.fillna("").str.startswith("not compared")]
        line = (f"pool {pool}: {compared} of {len(g)} restored turn(s) compared on their restore window, "
                f"{int((status == 'flagged').sum())} past its limits")
        if len(missing):
            line += (f"; {len(missing)} not compared ({str(missing.iloc[0])[len('not compared: '):]}"
                     + (", ..." if len(missing) > 1 else "") + ")")
        if status.isna().any():  # harness/window.py wants_window: no second prompt token past the checkpoint
            line += (f"; {int(status.isna().sum())} with no window to probe (at most one prompt token past the "
                     "checkpoint)")
        out.append(line)
    return out
