"""Verify crossings of a batch of candidates from their `spec_trace` column (list<list<int32>>), in numpy.

`crossings_of` gives, per row, what `reports.analyze.verify_crossings(trace, interval)` gives for the row's
trace (as crossing dicts): only the verify steps that cross a boundary become Python objects. A row whose
trace has a step with fewer than two values or a null length is left to verify_crossings (as the record path
would read it). `accepted_of` gives, per row, the draft tokens its trace accepted (reports/facts.py).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reports.analyze import crossing_dict, verify_crossings
from reports.facts import accepted_tokens
from reports.oracle_vec import _list


def crossings_of(trace: pa.Array, intervals: list[int | None]) -> list[list[dict] | None]:
    """Per row: its reported crossings (as analyze.crossing_dict gives them), or None where its trace is null
    (crossings are inferred then).
    Rows without an interval get an empty list (the caller records no crossings for them)."""
    if isinstance(trace, pa.ChunkedArray):
        trace = trace.combine_chunks()
    n = len(trace)
    out: list[list[dict] | None] = [None if not trace[i].is_valid else [] for i in range(n)] \
        if trace.null_count else [[] for _ in range(n)]
    if n == 0:
        return out
    s_start, s_len, steps = _list(trace)  # rows -> verify steps
    v_start, v_len, values = _list(steps)  # steps -> [pre_len, commit_len, tracked_step]
    vals = (pc.fill_null(values, 0) if values.null_count else values).to_numpy(zero_copy_only=False)
    vals = vals.astype(np.int64)
    nulls = values.is_null().to_numpy(zero_copy_only=False) if values.null_count else np.zeros(len(vals), bool)
    interval = np.array([i if i else 0 for i in intervals], dtype=np.int64)
    rows = np.repeat(np.arange(n), s_len)
    step_ix = np.repeat(s_start, s_len) + (np.arange(len(rows)) - np.repeat(np.cumsum(s_len) - s_len, s_len))
    start, length = v_start[step_ix], v_len[step_ix]
    odd = length < 2
    odd[~odd] |= nulls[start[~odd]] | nulls[start[~odd] + 1]
    odd_rows = set(rows[odd].tolist())
    ok = ~odd & (interval[rows] > 0)
    pre = np.where(ok, vals[np.where(ok, start, 0)], 0)
    commit = np.where(ok, vals[np.where(ok, start + 1, 0)], 0)
    every = np.where(ok, interval[rows], 1)
    post = pre + commit
    cross = ok & (pre // every != post // every)
    boundary = post // every * every
    has_tracked = cross & (length > 2)
    t_at = np.where(has_tracked, start + 2, 0)
    tracked_null = ~has_tracked | nulls[t_at]
    tracked = vals[t_at]
    for i in np.flatnonzero(cross).tolist():
        r = int(rows[i])
        if r in odd_rows or out[r] is None:
            continue
        b, p, c = int(boundary[i]), int(pre[i]), int(commit[i])
        t = None if tracked_null[i] else int(tracked[i])
        step = b - p - 1
        out[r].append({"boundary": b, "source": "reported", "pre_len": p, "commit_len": c, "step": step,
                       "tracked": t, "tracked_agrees": t == step})
    for r in odd_rows:
        if out[r] is not None and intervals[r]:
            out[r] = [crossing_dict(x) for x in verify_crossings(trace[r].as_py(), intervals[r])]  # raises as it
    return out


def accepted_of(trace: pa.Array) -> list[int | None]:
    """Per row: the draft tokens its verify steps accepted (reports.facts.accepted_tokens of its trace), None
    where its trace is null. Rows with a step of fewer than two values or a null commit length are left to
    accepted_tokens (which raises as the record path would)."""
    if isinstance(trace, pa.ChunkedArray):
        trace = trace.combine_chunks()
    n = len(trace)
    if n == 0:
        return []
    s_start, s_len, steps = _list(trace)
    v_start, v_len, values = _list(steps)
    vals = (pc.fill_null(values, 0) if values.null_count else values).to_numpy(zero_copy_only=False)
    vals = vals.astype(np.int64)
    nulls = values.is_null().to_numpy(zero_copy_only=False) if values.null_count else np.zeros(len(vals), bool)
    rows = np.repeat(np.arange(n), s_len)
    step_ix = np.repeat(s_start, s_len) + (np.arange(len(rows)) - np.repeat(np.cumsum(s_len) - s_len, s_len))
    start, length = v_start[step_ix], v_len[step_ix]
    odd = length < 2
    odd[~odd] |= nulls[start[~odd] + 1]
    commit = np.where(odd, 1, vals[np.where(odd, 0, start + 1)])
    total = np.zeros(n, dtype=np.int64)
    np.add.at(total, rows, np.maximum(commit - 1, 0))
    valid = trace.is_valid().to_numpy(zero_copy_only=False)
    out: list[int | None] = [int(t) if v else None for t, v in zip(total.tolist(), valid.tolist(), strict=True)]
    for r in set(rows[odd].tolist()):
        out[r] = accepted_tokens(trace[r].as_py())
    return out
