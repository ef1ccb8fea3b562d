"""The oracle over Arrow columns: reports/oracle.py's classification of a whole batch of candidates at once.

`classify_batch` gives, for each candidate row, the Classification `oracle.classify` gives for its record and
its reference's: the first divergence and the log-prob drift (its value, onset and positions compared) are
computed with numpy over the flat values of the list columns (`output_ids`, `output_logprobs`, the split
top-k `top_logprobs` / `top_ids`, records/columns.py), and the decision at the divergence is `oracle.decide`,
the same code as the record oracle's. Rows the array path does not cover exactly are classified by
`oracle.classify` on their records (a `fallback` callback builds them): a log-prob list whose length is
neither 0 nor its output's, a non-finite log-prob, a top-k list over K_MAX entries or naming one token twice,
top-k ids and log-probs of different shapes, values kept in `_extra` (the caller says which rows).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from reports.envelope import Envelope
from reports.oracle import Classification, Drift, classify, decide

K_MAX = 8  # top-k entries per position the array path handles (engines return 2)
_PAD_CAND, _PAD_REF = -(1 << 40), -(1 << 41)  # ids of padding slots: they match nothing (ids are int32)


def _list(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """(start, length) of each row of a list array into its `.values`, and the values; a null row is empty."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    off = arr.offsets.to_numpy().astype(np.int64)
    start, length = off[:-1], np.diff(off)
    if arr.null_count:
        length = np.where(arr.is_null().to_numpy(zero_copy_only=False), 0, length)
    return start, length, arr.values


@dataclass(frozen=True)
class Side:
    """One side (candidates or their references) of a batch: flat numpy views of its token columns."""

    ids: np.ndarray  # int64 flat output ids
    ids_start: np.ndarray  # [rows]
    ids_len: np.ndarray  # [rows]
    lp: np.ndarray  # float64 flat chosen-token log-probs
    lp_start: np.ndarray
    lp_len: np.ndarray
    top_start: np.ndarray  # [rows] first position (into top_lp / top_id rows)
    top_len: np.ndarray  # [rows] positions with a top-k list
    top_lp: np.ndarray  # [positions, K] float64, NaN-padded
    top_id: np.ndarray  # [positions, K] int64, padded with ids that match nothing
    irregular: np.ndarray  # [rows] bool: the array path cannot decide this row exactly

    @classmethod
    def of(cls, output_ids: pa.Array, output_logprobs: pa.Array, top_logprobs: pa.Array, top_ids: pa.Array,
           pad: int) -> Side:
        """A side from its four list columns (equal lengths)."""
        i_start, i_len, i_vals = _list(output_ids)
        l_start, l_len, l_vals = _list(output_logprobs)
        t_start, t_len, t_inner = _list(top_logprobs)
        u_start, u_len, u_inner = _list(top_ids)
        q_start, q_len, q_vals = _list(t_inner)
        v_start, v_len, v_vals = _list(u_inner)
        ids = i_vals.to_numpy(zero_copy_only=False).astype(np.int64)
        lp = l_vals.to_numpy(zero_copy_only=False).astype(np.float64)
        n = len(i_start)
        irregular = ((l_len != 0) & (l_len != i_len)) | ((t_len != 0) & (t_len != i_len))
        irregular |= ((t_start != u_start) | (t_len != u_len)) & (t_len > 0)
        irregular |= _rows_with(~np.isfinite(lp), l_start, l_len, n)
        positions = len(q_len)
        k = int(min(max(q_len.max(initial=1), 1), K_MAX))  # slots: the widest list the array path holds
        top_lp = np.full((positions, k), np.nan)
        top_id = np.full((positions, k), pad, dtype=np.int64)
        if positions != len(v_len) or not (np.array_equal(q_start, v_start) and np.array_equal(q_len, v_len)):
            irregular |= t_len > 0  # top-k ids and log-probs of different shapes: the record oracle decides
        elif positions and _packed(q_start, q_len, k):  # every list k long, back to back: a reshape
            base = int(q_start[0])
            top_lp = q_vals.slice(base, positions * k).to_numpy(zero_copy_only=False).astype(np.float64)
            top_lp = top_lp.reshape(positions, k)
            top_id = v_vals.slice(base, positions * k).to_numpy(zero_copy_only=False).astype(np.int64)
            top_id = top_id.reshape(positions, k)
            bad = _duplicates(top_id, pad) | ~np.isfinite(top_lp).all(axis=1)
            irregular |= _rows_with(bad, t_start, t_len, n)
        elif positions:
            qv = q_vals.to_numpy(zero_copy_only=False).astype(np.float64)
            vv = v_vals.to_numpy(zero_copy_only=False).astype(np.int64)
            excl = np.cumsum(q_len) - q_len
            pos = np.repeat(np.arange(positions), q_len)  # the position of each entry
            slot = np.arange(len(pos)) - np.repeat(excl, q_len)  # its index in its position's list
            flat = np.repeat(q_start, q_len) + slot  # its index into the flat values
            fits = slot < k
            top_lp[pos[fits], slot[fits]] = qv[flat[fits]]
            top_id[pos[fits], slot[fits]] = vv[flat[fits]]
            bad = (q_len > K_MAX) | _duplicates(top_id, pad)
            bad[pos[~np.isfinite(qv[flat])]] = True
            irregular |= _rows_with(bad, t_start, t_len, n)
        return cls(ids, i_start, i_len, lp, l_start, l_len, t_start, t_len, top_lp, top_id, irregular)


def _packed(start: np.ndarray, length: np.ndarray, k: int) -> bool:
    """Every list has k entries and each starts where the one before it ends."""
    return bool((length == k).all() and (start[-1] - start[0] == k * (len(start) - 1)))


def _duplicates(top_id: np.ndarray, pad: int) -> np.ndarray:
    """[positions] True where one token id is in two slots (the record oracle keeps one of them)."""
    dup = np.zeros(len(top_id), dtype=bool)
    for a in range(top_id.shape[1]):
        for b in range(a + 1, top_id.shape[1]):
            dup |= (top_id[:, a] == top_id[:, b]) & (top_id[:, a] != pad)
    return dup


def _rows_with(bad: np.ndarray, start: np.ndarray, length: np.ndarray, n: int) -> np.ndarray:
    """[rows] True where some element of the row's range [start, start + length) of `bad` is True."""
    if not bad.any():
        return np.zeros(n, dtype=bool)
    cum = np.concatenate([[0], np.cumsum(bad)])
    return (cum[start + length] - cum[start]) > 0


def _first_true(rows: np.ndarray, mask: np.ndarray, values: np.ndarray, n: int, missing: int = -1) -> np.ndarray:
    """[n] the `values` entry of each row's first True in `mask` (entries grouped by row, in order), else missing."""
    out = np.full(n, missing, dtype=np.int64)
    hit_rows, first = np.unique(rows[mask], return_index=True)
    out[hit_rows] = values[mask][first]
    return out


def _segments(length: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row, index within the row) of each entry when row r has `length[r]` entries."""
    rows = np.repeat(np.arange(len(length)), length)
    return rows, np.arange(len(rows)) - np.repeat(np.cumsum(length) - length, length)


def classify_batch(cand: Side, ref: Side, cand_error: list, ref_error: list | None, has_ref: np.ndarray,
                   thresholds: np.ndarray, tolerances: np.ndarray,
                   fallback: Callable[[int], tuple[dict, dict | None]],
                   envelopes: Sequence[Envelope | None] | None = None) -> list[Classification]:
    """One Classification per candidate row, equal to `classify(candidate record, reference record)`.

    `cand_error` / `ref_error`: the rows' `error` values; `has_ref`: [rows] whether a reference was found;
    `thresholds` / `tolerances`: [rows] each row's margin threshold and drift tolerance; `fallback(i)`: row
    i's (candidate record, reference record) for the rows the array path leaves to `classify`; `envelopes`:
    [rows] each row's envelope (reports/envelope.py), None for none.
    """
    n = len(cand.ids_len)
    envelopes = envelopes if envelopes is not None else [None] * n
    out: list[Classification | None] = [None] * n
    vector = has_ref & ~cand.irregular & ~ref.irregular
    for i in range(n):
        if cand_error[i]:
            out[i] = Classification("error", f"candidate error: {cand_error[i]}")
        elif not has_ref[i]:
            out[i] = Classification("error", "no reference")
        elif ref_error[i]:
            out[i] = Classification("error", f"reference error: {ref_error[i]}")
        elif not vector[i]:
            c, r = fallback(i)
            out[i] = classify(c, r, float(thresholds[i]), float(tolerances[i]), envelopes[i])
    todo = np.array([out[i] is None for i in range(n)], dtype=bool)
    if not todo.any():
        return out  # type: ignore[return-value]
    p, drift = _divergence_and_drift(cand, ref, todo, tolerances, envelopes)
    for i in np.flatnonzero(todo).tolist():
        pi = int(p[i])
        d = drift[i]
        if pi < 0:
            out[i] = decide(None, d, None, None, None, None, float(thresholds[i]), float(tolerances[i]))
            continue
        c_len, r_len = int(cand.ids_len[i]), int(ref.ids_len[i])
        out[i] = decide(pi, d, int(cand.ids[cand.ids_start[i] + pi]) if pi < c_len else None,
                        int(ref.ids[ref.ids_start[i] + pi]) if pi < r_len else None,
                        _top_at(cand, i, pi), _top_at(ref, i, pi), float(thresholds[i]), float(tolerances[i]),
                        c_len, r_len)
    return out  # type: ignore[return-value]


def _top_at(side: Side, i: int, p: int) -> list[list] | None:
    """Row i's top-k list at output p as `[[logprob, id], ...]` (None: the row has none there)."""
    if p >= side.top_len[i]:
        return None
    q = side.top_start[i] + p
    return [[float(lp), int(t)] for lp, t in zip(side.top_lp[q], side.top_id[q], strict=True) if not np.isnan(lp)]


def _divergence_and_drift(cand: Side, ref: Side, rows_mask: np.ndarray, tol: np.ndarray,
                          envelopes: Sequence[Envelope | None]) -> tuple[np.ndarray, list[Drift | None]]:
    """([rows] first divergence, -1 where the tokens are equal; each row's Drift) for the rows of `rows_mask`."""
    n = len(rows_mask)
    m = np.where(rows_mask, np.minimum(cand.ids_len, ref.ids_len), 0)
    rows, j = _segments(m)
    neq = cand.ids[cand.ids_start[rows] + j] != ref.ids[ref.ids_start[rows] + j]
    p = _first_true(rows, neq, j, n)
    p = np.where((p < 0) & (cand.ids_len != ref.ids_len), m, p)  # one output a strict prefix of the other
    p = np.where(rows_mask, p, -1)
    upto = np.where(p < 0, cand.ids_len, p)
    flip = (p >= 0) & (p < m)
    # positions compared: [0, upto) on the chosen token and the shared top-k entries, then the flip on top-k only
    seg = np.where(rows_mask, upto + flip, 0)
    rows, j = _segments(seg)
    seg_start = np.cumsum(seg) - seg
    top_only = j == upto[rows]
    diff = np.full(len(rows), -np.inf)
    chosen = ~top_only & (cand.lp_len[rows] > 0) & (ref.lp_len[rows] > 0)
    diff[chosen] = np.abs(cand.lp[cand.lp_start[rows[chosen]] + j[chosen]] - ref.lp[ref.lp_start[rows[chosen]]
                                                                                   + j[chosen]])
    both = (cand.top_len[rows] > 0) & (ref.top_len[rows] > 0)
    cq, rq = cand.top_start[rows[both]] + j[both], ref.top_start[rows[both]] + j[both]
    top = np.full(len(cq), -np.inf)
    for a in range(cand.top_id.shape[1]):
        for b in range(ref.top_id.shape[1]):
            match = cand.top_id[cq, a] == ref.top_id[rq, b]
            top = np.where(match, np.maximum(top, np.abs(cand.top_lp[cq, a] - ref.top_lp[rq, b])), top)
    diff[both] = np.maximum(diff[both], top)
    measured = diff > -np.inf
    onset = _first_true(rows, measured & (diff > tol[rows]), j, n)
    value = np.full(n, -np.inf)
    np.maximum.at(value, rows[measured], diff[measured])
    before = np.full(n, -np.inf)  # the flip's own top-k left out (Drift.before)
    np.maximum.at(before, rows[measured & ~top_only], diff[measured & ~top_only])
    compared = np.bincount(rows[measured], minlength=n)
    has_data = ((cand.lp_len > 0) | (cand.top_len > 0)) & ((ref.lp_len > 0) | (ref.top_len > 0))
    drifts: list[Drift | None] = [None] * n
    for i in np.flatnonzero(rows_mask).tolist():
        if not has_data[i] and (upto[i] > 0 or flip[i]):
            drifts[i] = Drift(None, None, 0)  # a side without log-probs: not measurable
        else:
            drifts[i] = Drift(float(value[i]) if compared[i] else 0.0, int(onset[i]) if onset[i] >= 0 else None,
                              int(compared[i]), before=max(float(before[i]), 0.0))
            if envelopes[i] is not None and compared[i]:
                drifts[i] = _with_envelope(drifts[i], envelopes[i], diff, measured, j, int(seg_start[i]),
                                           int(seg[i]))
    return p, drifts


def _with_envelope(d: Drift, envelope: Envelope, diff: np.ndarray, measured: np.ndarray, j: np.ndarray,
                   start: int, length: int) -> Drift:
    """`d` with its onset where the row's running sum of drift passes `envelope`, if that comes first (the
    values and their order are the record oracle's: reports/oracle.py logprob_drift)."""
    keep = measured[start:start + length]
    values, positions = diff[start:start + length][keep], j[start:start + length][keep]
    passed = envelope.onset(values.tolist())
    if passed is None or (d.onset is not None and int(positions[passed[0]]) >= d.onset):
        return d
    return Drift(d.value, int(positions[passed[0]]), d.compared, (passed[1], passed[2]), d.before)
