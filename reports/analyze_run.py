"""Analyze a run directory in bounded memory: the requests frame of reports/analyze.py, streamed from the records.

`analyze_run(run_dir, ...)` gives the frame `analyze(load_run(run_dir).candidates, ...references)` gives, without
holding any record's token lists beyond one batch:

1. an index pass reads the candidates' scalar columns (records/reader.py batches), where each reference is
   (records/lookup.py), and which prefixes the restore links will compare;
2. a token pass reads the candidates' token columns a row group at a time, takes their references' rows (a
   byte-bounded cache of row groups), classifies the batch with reports/oracle_vec.py, computes verify
   crossings from `spec_trace` in numpy, and digests the prefixes the links compare;
3. the links (analyze.link_restored_checkpoints) compare digests instead of id lists;
4. the tree shapes (reports/tree_shapes.py) walk each sweep point's ids, spilled to a temporary file in the token
   pass and read back one point at a time.

The token pass also gathers the verdict's TokenFacts (reports/facts.py). What it holds: one scalar dict per
candidate, the frame, digests, the facts, at most `budget` bytes of row groups, and one sweep point's ids.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from records import layout as L
from records.columns import FIELDS
from records.lookup import RowStore
from records.reader import RunReader
from reports.analyze import REQUEST_COLUMNS, frame
from reports.analyze_batch import ORACLE_FIELDS, TOKENS, batch_rows
from reports.facts import TokenFacts
from reports.oracle import DRIFT_TOLERANCE, MARGIN_THRESHOLD
from reports.tree_shapes import request_shapes
from reports.window import WINDOW_LISTS

SCALARS = ["key", "run_id", "role", "pool", "engine", "interval", "concurrency", "replica_id", "node_id", "suite",
           "case", "case_id", "session_id", "turn", "input_hash", "input_len", "cached_tokens", "completion_tokens",
           "finish_reason", "spec_verify_ct", "spec_accept_length", "ttft", "itl", "e2e", "t_start", "retries",
           "error", "tokenizer", "cache_lost", "_extra", "_absent"]


@dataclass
class AnalyzedRun:
    """A run's requests frame and what its reading found (as records.jsonl.RunRecords says it)."""

    df: object  # pandas DataFrame, REQUEST_COLUMNS
    candidates: list[dict]  # per candidate, its scalar fields (no token lists), in frame order
    stats: list[dict] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)
    duplicates: int = 0
    references: int = 0  # distinct reference input hashes
    facts: TokenFacts = field(default_factory=TokenFacts)  # per candidate: first-token drift, accepted drafts
    shapes: object = None  # pandas DataFrame: reports.tree_shapes.request_shapes of the candidates


_PARSED: dict[str, object] = {}  # JSON text -> its value: engine settings and case metadata repeat


def _json(text: str):
    """The parsed JSON text, shared between rows with equal text (read only: row_of only reads them)."""
    value = _PARSED.get(text)
    if value is None:
        if len(_PARSED) > 100_000:
            _PARSED.clear()
        value = _PARSED[text] = json.loads(text)
    return value


def _scalars(data: dict[str, list], i: int) -> dict:
    """Row i's fields as the record dict has them (JSON fields parsed, `_extra` put back, absent ones left out),
    but for its token lists."""
    rec = {}
    extra = json.loads(data["_extra"][i]) if data["_extra"][i] is not None else {}
    absent = set(data["_absent"][i] or ())
    for name, col in data.items():
        if name.startswith("_") or name in absent:
            continue
        if name in extra:
            rec[name] = extra[name]
        elif FIELDS.get(name) == "json":
            rec[name] = _json(col[i])
        else:
            rec[name] = col[i]
    tokens = ORACLE_FIELDS | {"input_ids", "spec_trace"}
    for name, value in extra.items():  # fields with no column of their own (ttst, t_planned, ...)
        if name not in data and name not in tokens and name not in WINDOW_LISTS:  # the window's: token pass
            rec[name] = value
    rec["_extra_keys"] = frozenset(extra) & tokens
    return rec


def _field(data: dict[str, list], i: int, name: str):
    """One field of row i as its record has it (_scalars for just that field)."""
    extra = data["_extra"][i]
    if extra is not None and f'"{name}"' in extra and name in (parsed := json.loads(extra)):
        return parsed[name]
    return None if name in (data["_absent"][i] or ()) else data[name][i]


class _Spill:
    """Each candidate row's input ids and input + output ids, written to a temporary file in the token pass and
    read back one sweep point at a time for the tree shapes (reports/tree_shapes.py)."""

    _I32 = np.iinfo(np.int32)

    def __init__(self) -> None:
        self.file = tempfile.TemporaryFile(prefix="specgate-ids-")
        self.at: dict[int, tuple[int, int, int, np.dtype]] = {}  # row -> (offset, input length, length, dtype)
        self.size = 0

    def add(self, k: int, ids, out_ids) -> None:
        seq = np.concatenate([np.asarray(ids if ids is not None else [], np.int64),
                              np.asarray(out_ids if out_ids is not None else [], np.int64)])
        n_in = 0 if ids is None else len(ids)
        if not len(seq) or (seq.min() >= self._I32.min and seq.max() <= self._I32.max):
            seq = seq.astype(np.int32)
        data = seq.tobytes()
        self.file.seek(self.size)
        self.file.write(data)
        self.at[k] = (self.size, n_in, len(seq), seq.dtype)
        self.size += len(data)

    def load(self, rows: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per row: (input ids, input + output ids), views of one array read back."""
        out = []
        for k in rows:
            offset, n_in, n, dtype = self.at[k]
            self.file.seek(offset)
            seq = np.frombuffer(self.file.read(n * dtype.itemsize), dtype=dtype)
            out.append((seq[:n_in], seq))
        return out

    def close(self) -> None:
        self.file.close()


class _Index:
    """The index pass: candidates' scalar fields, references' places, the prefixes the links need."""

    def __init__(self, reader: RunReader, store: RowStore) -> None:
        self.cands: list[dict] = []
        self.refs: dict[str, tuple] = {}
        self.seen: set = set()
        self.stems = [s for s in reader.stems() if L.is_request_stem(s)]
        self.has_candidates = dict.fromkeys(self.stems, False)
        for stem in self.stems:
            for batch, s, g, rows in store.scan(stem, SCALARS, self.seen, spill_role="reference"):
                data = batch.to_pydict()
                self.has_candidates[stem] |= "candidate" in data["role"]
                for i, role in enumerate(data["role"]):
                    if role == "candidate":
                        self.cands.append(_scalars(data, i))
                    elif role == "reference":
                        self.refs.setdefault(str(_field(data, i, "input_hash")), (s, g, int(rows[i])))
        self.in_len: dict[int, int] = {}  # row -> length of its input prefix to digest
        self.seq_lens: dict[int, set[int]] = {}  # row -> lengths of its input + output prefixes to digest
        first: dict[tuple, int] = {}
        for k, c in enumerate(self.cands):
            first.setdefault((c.get("pool"), c.get("concurrency"), c.get("session_id"), c.get("turn")), k)
        for k, c in enumerate(self.cands):
            turn, cached = c.get("turn"), int(c.get("cached_tokens") or 0)
            if not isinstance(turn, int) or turn <= 0 or cached <= 0:
                continue
            self.in_len[k] = cached
            for t in range(turn):
                j = first.get((c.get("pool"), c.get("concurrency"), c.get("session_id"), t))
                if j is not None:
                    self.seq_lens.setdefault(j, set()).add(cached)


def analyze_run(run_dir: str | Path, threshold: float = MARGIN_THRESHOLD, tolerance: float = DRIFT_TOLERANCE,
                per_pool: Mapping[str, tuple] | None = None, budget: int = 64 << 20,
                ladder_pools: Callable[[str], bool] | None = None) -> AnalyzedRun:
    """The requests frame of `run_dir` (equal to reports.analyze.analyze over load_run's records), streamed;
    `per_pool` as in analyze; `budget`: bytes of reference and prompt row groups kept for reuse; `ladder_pools`:
    the pools whose candidates' ladder sums the facts hold (TokenFacts.of's)."""
    per_pool = per_pool or {}
    reader = RunReader(run_dir)
    store = RowStore(reader, budget)
    spill = _Spill()
    try:
        index = _Index(reader, store)
        prompts = store.prompt_index()
        cols: dict[str, list] = {c: [] for c in REQUEST_COLUMNS}
        digests: dict[tuple[int, int], bytes] = {}  # (row, length) -> digest of input[:length] (length < 0)
        has_input: dict[int, bool] = {}
        facts = TokenFacts()
        k = 0
        seen: set = set()
        quiet = RunReader(run_dir)  # the token pass reads again: its warnings are the index pass's
        tstore = RowStore(quiet, 0)
        for stem in index.stems:
            if not index.has_candidates[stem]:  # its keys only, so that `seen` drops what the index pass dropped
                for _ in quiet.batches(stem, ["key"], seen):
                    pass
                continue
            for batch, _, _, _ in tstore.scan(stem, TOKENS, seen):
                roles = batch.column("role").to_pylist()
                mine = np.array([r == "candidate" for r in roles], dtype=bool)
                if not mine.any():
                    continue
                tb = batch.filter(pa.array(mine))
                ks = list(range(k, k + tb.num_rows))
                k += tb.num_rows
                batch_rows(tb, ks, index, store, prompts, per_pool, (threshold, tolerance), cols, digests, has_input,
                           facts, spill, ladder_pools)
        stats = [r for stem in reader.stems() if not L.is_request_stem(stem)
                 for r in reader.records(stem, index.seen) if r.get("role") == "stats"]

        def on_path(i: int, j: int, length: int) -> bool:
            if not has_input.get(i, True) or not has_input.get(j, True):
                return True
            return digests[(i, -length)] == digests[(j, length)]

        df = frame(cols, on_path)
        cols.clear()
        digests.clear()
        row_of_rec = {id(c): k for k, c in enumerate(index.cands)}
        shapes = request_shapes(index.cands, lambda recs: spill.load([row_of_rec[id(r)] for r in recs]))
        for c in index.cands:
            c.pop("_extra_keys", None)
        return AnalyzedRun(df, index.cands, stats, reader.truncated, reader.corrupt,
                           reader.duplicates, len(index.refs), facts, shapes)
    finally:
        store.close()
        spill.close()
