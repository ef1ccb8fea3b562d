"""What the verdict takes from a run's token lists besides the requests frame, one small value per candidate.

The gate's checks past the oracle read two things from the records' token lists: the drift of a restored turn's
first output token (reports/controls.py, restore onsets) and the draft tokens a pool accepted (reports/
exercised.py, from `spec_trace`); a calibration (harness/calibrate.py) also reads its controls' drift summed over
their first outputs (reports/envelope.py, `ladder_sums`), and the restore window check (reports/window.py) each
probed turn's window. `TokenFacts` holds those per candidate, so that a report can be judged and a run calibrated
without holding any record: the streamed analyzer (reports/analyze_run.py) fills it batch by batch, and
`TokenFacts.of(records, references)` gives the same values from record dicts.

A run of a million candidates holds them all at once, so they are columns in candidate order (the frame's), not
dicts: a float per candidate, an integer, the window differences in one flat float32 array, the keys as Arrow
text. A reader asks for the values of a column of keys at once (`first_drifts(df["key"])`), looked up through an
Arrow hash of the keys.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterable, Mapping

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from reports.envelope import ladder_sums
from reports.oracle import compared_drifts
from reports.window import WindowFact, window_fact


def first_token_drift(cand: dict, ref: dict | None) -> float | None:
    """|candidate - reference| log-prob of the first output token, where both chose the same token (None else).
    A restored turn's first token comes from the prefill after its checkpoint: with a wrong state it moves from
    there, while the path numerics of a split prefill move it very little (bf16: <= 0.006 on the trained model,
    where whole turns drift by 0.17 through verify numerics)."""
    if ref is None:
        return None
    c, r = cand.get("output_logprobs") or [], ref.get("output_logprobs") or []
    ids_c, ids_r = cand.get("output_ids") or [], ref.get("output_ids") or []
    if not c or not r or not ids_c or not ids_r or ids_c[0] != ids_r[0] or c[0] is None or r[0] is None:
        return None
    return abs(float(c[0]) - float(r[0]))


def accepted_tokens(trace: Iterable | None) -> int | None:
    """Draft tokens a request's verify steps accepted (each step's commit length past its bonus token); None
    without a `spec_trace`."""
    if trace is None:
        return None
    return sum(max(0, int(e[1]) - 1) for e in trace) if trace else 0


_KEYS_AT_ONCE = 8192  # keys gathered as Python text before they become one Arrow chunk


class TokenFacts:
    """Per candidate, in the order they were added (the frame's): its key, its first output token's drift
    (first_token_drift; None: not compared), the draft tokens it accepted (None: no spec_trace), its restore
    window (reports/window.py: a WindowFact, why a probed turn's window was not compared, or None: not probed)
    and, for the pools a calibration asked for, its ladder sums (`add_ladder`)."""

    def __init__(self) -> None:
        self._chunks: list[pa.Array] = []  # the keys, as Arrow large_string (a text column's own type in pandas)
        self._pending: list[str] = []
        self._mark = 0  # the chunks from here on hold keys share_keys has not been given yet
        self._drift = array("d")  # NaN: none
        self._accepted = array("q")  # -1: none
        self._win_row, self._win_start, self._win_end = array("q"), array("q"), array("q")  # end: into _diffs
        self._diffs = array("f")
        self._win_reason: dict[int, str] = {}  # row -> why its window was not compared
        self._ladders: dict[int, tuple[float, ...]] = {}  # row -> ladder sums

    def __len__(self) -> int:
        return len(self._drift)

    def add(self, key: str, drift: float | None, accepted: int | None, window: WindowFact | str | None = None
            ) -> int:
        """Append a candidate's facts; its row."""
        row = len(self._drift)
        self._pending.append(key)
        if len(self._pending) >= _KEYS_AT_ONCE:
            self._flush()
        self._drift.append(math.nan if drift is None else float(drift))
        self._accepted.append(-1 if accepted is None else int(accepted))
        if isinstance(window, str):
            self._win_reason[row] = window
        elif window is not None:
            self._win_row.append(row)
            self._win_start.append(window.start)
            self._diffs.extend(window.diffs.tolist())  # float32 values: stored exactly
            self._win_end.append(len(self._diffs))
        return row

    def add_ladder(self, row: int, cand: dict, ref: dict | None) -> None:
        """The ladder sums of row's candidate `cand` (a record of an asked-for pool) against `ref`, if both
        answered."""
        if not cand.get("error") and ref is not None and not ref.get("error"):
            self._ladders[row] = ladder_sums(compared_drifts(cand, ref))

    def extend(self, other: TokenFacts) -> None:
        """Append another's candidates (they follow this one's)."""
        base = len(self)
        self._flush()
        other._flush()
        self._chunks += other._chunks
        self._mark = len(self._chunks)
        self._drift.extend(other._drift)
        self._accepted.extend(other._accepted)
        self._win_row.extend(r + base for r in other._win_row)
        self._win_start.extend(other._win_start)
        self._win_end.extend(e + len(self._diffs) for e in other._win_end)
        self._diffs.extend(other._diffs)
        self._win_reason.update({r + base: v for r, v in other._win_reason.items()})
        self._ladders.update({r + base: v for r, v in other._ladders.items()})

    def _flush(self) -> None:
        if self._pending:
            self._chunks.append(pa.array(self._pending, pa.large_string()))
            self._pending = []

    def share_keys(self, keys: pd.Series) -> bool:
        """Hold the keys added since the last call as `keys`' own Arrow data (a frame's text column of those same
        keys, in order), not as a copy of them: the analysis holds each key once. False, and nothing changes,
        where `keys` is no Arrow text or not those keys."""
        data = getattr(keys, "array", None)
        if not hasattr(data, "__arrow_array__") or not pd.api.types.is_string_dtype(keys.dtype):
            return False
        data = pa.chunked_array(pa.array(data))
        mine = self._chunks[self._mark:] + ([pa.array(self._pending, pa.large_string())] if self._pending else [])
        if data.type != pa.large_string() or not data.equals(pa.chunked_array(mine, pa.large_string())):
            return False
        self._chunks[self._mark:] = data.chunks
        self._pending = []
        self._mark = len(self._chunks)
        return True

    def rows(self, keys) -> np.ndarray:
        """The row of each key (a Series, Arrow array or iterable of text); -1 where none."""
        self._flush()
        if isinstance(keys, (pd.Series, pd.Index)):
            keys = keys.array  # a text column's Arrow data as it is (no Python string per row)
        if not isinstance(keys, (pa.Array, pa.ChunkedArray)):
            keys = pa.array(keys) if hasattr(keys, "__arrow_array__") else pa.array(list(keys), pa.string())
        if not len(keys) or not self._chunks:
            return np.full(len(keys), -1, dtype=np.int64)
        found = pc.index_in(keys.cast(pa.large_string()), value_set=pa.chunked_array(self._chunks, pa.large_string()))
        return found.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)

    def first_drifts(self, keys) -> list[float | None]:
        """Each key's first-token drift (None: none)."""
        drift = self._drift
        return [None if r < 0 or math.isnan(d := drift[r]) else d for r in self.rows(keys).tolist()]

    def accepted(self, keys) -> list[int | None]:
        """Each key's accepted draft tokens (None: no spec_trace, or not a candidate here)."""
        return [None if r < 0 or (n := self._accepted[r]) < 0 else n for r in self.rows(keys).tolist()]

    def windows(self, keys) -> list[WindowFact | str | None]:
        """Each key's restore window: a WindowFact, why it was not compared, or None (not probed)."""
        return self.windows_at(self.rows(keys))

    def probed(self, rows: np.ndarray) -> np.ndarray:
        """Whether each row (of `rows`) has a restore window, compared or not."""
        return np.isin(rows, np.array(self._win_row, dtype=np.int64)) | \
            np.isin(rows, np.fromiter(self._win_reason, dtype=np.int64, count=len(self._win_reason)))

    def windows_at(self, rows: np.ndarray) -> list[WindowFact | str | None]:
        """The restore window of each row (-1: None)."""
        win_row = np.array(self._win_row, dtype=np.int64)
        at = np.searchsorted(win_row, rows)
        out: list[WindowFact | str | None] = []
        for r, i in zip(rows.tolist(), at.tolist(), strict=True):
            if r < 0:
                out.append(None)
            elif i < len(win_row) and self._win_row[i] == r:
                start = self._win_end[i - 1] if i else 0
                out.append(WindowFact(self._win_start[i], np.array(self._diffs[start:self._win_end[i]], np.float32)))
            else:
                out.append(self._win_reason.get(r))
        return out

    def ladders(self, keys) -> list[tuple[float, ...] | None]:
        """Each key's ladder sums (None: its pool was not asked for, or it or its reference failed)."""
        return [self._ladders.get(r) if r >= 0 else None for r in self.rows(keys).tolist()]

    def keys(self) -> list[str]:
        """Every candidate's key, in row order."""
        self._flush()
        return [k for c in self._chunks for k in c.to_pylist()]

    def by_key(self) -> dict[str, dict]:
        """Every candidate's facts as dicts per fact, keyed by key (first_drift, accepted, window, ladders: only
        the candidates that have one); for small runs and tests: the verdict reads the columns."""
        keys = self.keys()
        windows = self.windows(keys)
        return {"first_drift": {k: d for k, d in zip(keys, self.first_drifts(keys), strict=True) if d is not None},
                "accepted": dict(zip(keys, self.accepted(keys), strict=True)),
                "window": {k: w for k, w in zip(keys, windows, strict=True) if w is not None},
                "ladders": {keys[r]: v for r, v in self._ladders.items()}}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TokenFacts):
            return NotImplemented
        a, b = self.by_key(), other.by_key()
        same_windows = a["window"].keys() == b["window"].keys() and all(
            w == v if isinstance(w, str) or isinstance(v, str) else (w.start == v.start and np.array_equal(w.diffs,
                                                                                                          v.diffs))
            for w, v in ((a["window"][k], b["window"][k]) for k in a["window"]))
        return (self.keys() == other.keys() and same_windows
                and all(a[f] == b[f] for f in ("first_drift", "accepted", "ladders")))

    __hash__ = None  # type: ignore[assignment]

    @classmethod
    def from_maps(cls, first_drift: Mapping[str, float] | None = None, accepted: Mapping[str, int | None] | None = None,
                  window: Mapping[str, WindowFact | str] | None = None) -> TokenFacts:
        """Facts given per key (every key any of the maps names is a candidate; what a map leaves out, it has
        none of)."""
        first_drift, accepted, window = first_drift or {}, accepted or {}, window or {}
        facts = cls()
        for key in dict.fromkeys([*first_drift, *accepted, *window]):
            facts.add(key, first_drift.get(key), accepted.get(key), window.get(key))
        return facts

    @classmethod
    def of(cls, records: Mapping[str, dict], references: Mapping[str, dict] | None = None,
           ladder_pools: Callable[[str], bool] | None = None) -> TokenFacts:
        """The facts of candidate records (key -> record) and their references (input_hash -> record);
        `ladder_pools(pool)`: whether a record's ladder sums are wanted (None: no one's)."""
        references = references or {}
        facts = cls()
        for key, rec in records.items():
            ref = references.get(str(rec.get("input_hash")))
            row = facts.add(key, first_token_drift(rec, ref), accepted_tokens(rec.get("spec_trace")),
                            window_fact(rec))
            if ladder_pools is not None and ladder_pools(str(rec.get("pool"))):
                facts.add_ladder(row, rec, ref)
        return facts
