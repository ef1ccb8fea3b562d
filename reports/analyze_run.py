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

The token pass also gathers the verdict's TokenFacts (reports/facts.py), each candidate's latency figures
(reports/latency.py) and what the tree shapes read of it (spilled with its ids). What it holds per candidate:
its frame row, latency row, digests and facts, where its reference is, and where its spill is; beyond that at
most `budget` bytes of row groups, one batch's records and one sweep point's spilled ids.
"""

from __future__ import annotations

import json
import pickle
import tempfile
from array import array
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from records import layout as L
from records.columns import FIELDS
from records.lookup import RowStore
from records.reader import RunReader
from reports.analyze import REQUEST_COLUMNS, chunk_frame, frames_joined
from reports.analyze_batch import ORACLE_FIELDS, TOKENS, batch_rows
from reports.facts import TokenFacts
from reports.latency import request_latency
from reports.links import LinkIndex
from reports.oracle import DRIFT_TOLERANCE, MARGIN_THRESHOLD
from reports.tree_shapes import point_of, shapes_of_points, slim
from reports.window import WINDOW_LISTS

CHUNK_ROWS = 8192  # frame rows typed at once: a chunk of a few rows costs more than its rows (61 columns)
LINKS = ["role", "pool", "concurrency", "session_id", "turn", "cached_tokens", "input_hash", "_extra", "_absent"]
SCALARS = ["key", "run_id", "role", "pool", "engine", "interval", "concurrency", "replica_id", "node_id", "suite",
           "case", "case_id", "session_id", "turn", "input_hash", "input_len", "cached_tokens", "completion_tokens",
           "finish_reason", "spec_verify_ct", "spec_accept_length", "ttft", "itl", "e2e", "t_start", "retries",
           "error", "tokenizer", "cache_lost", "_extra", "_absent"]


@dataclass
class AnalyzedRun:
    """A run's requests frame and what its reading found (as records.jsonl.RunRecords says it)."""

    df: object  # pandas DataFrame, REQUEST_COLUMNS
    latency: object = None  # pandas DataFrame: reports.latency.request_latency of the candidates, in frame order
    run_id: str | None = None  # the first candidate's
    cache_lost: Counter = field(default_factory=Counter)  # candidates per `cache_lost` reason (reports/incidents.py)
    stats: list[dict] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)
    duplicates: int = 0
    references: int = 0  # distinct reference input hashes
    facts: TokenFacts = field(default_factory=TokenFacts)  # per candidate: first-token drift, accepted drafts
    shapes: object = None  # pandas DataFrame: reports.tree_shapes.request_shapes of the candidates

    @property
    def n_candidates(self) -> int:
        return len(self.df)


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
    return rec


def _field(data: dict[str, list], i: int, name: str):
    """One field of row i as its record has it (_scalars for just that field)."""
    extra = data["_extra"][i]
    if extra is not None and f'"{name}"' in extra and name in (parsed := json.loads(extra)):
        return parsed[name]
    return None if name in (data["_absent"][i] or ()) else data[name][i]


class _Spill:
    """Each candidate row's input ids, input + output ids and what the tree shapes read of its record
    (reports/tree_shapes.py slim), written to a temporary file in the token pass and read back one sweep point at
    a time (rows are added in order, 0, 1, 2, ...)."""

    _I32 = np.iinfo(np.int32)

    def __init__(self) -> None:
        self.file = tempfile.TemporaryFile(prefix="specgate-ids-")
        self.offset, self.n_in, self.n, self.wide, self.meta = array("q"), array("q"), array("q"), array("b"), \
            array("q")
        self.size = 0

    def add(self, k: int, ids, out_ids, rec: dict) -> None:
        assert k == len(self.offset), (k, len(self.offset))
        seq = np.concatenate([np.asarray(ids if ids is not None else [], np.int64),
                              np.asarray(out_ids if out_ids is not None else [], np.int64)])
        n_in = 0 if ids is None else len(ids)
        wide = not (not len(seq) or (seq.min() >= self._I32.min and seq.max() <= self._I32.max))
        data = (seq if wide else seq.astype(np.int32)).tobytes()
        meta = pickle.dumps(slim(rec), protocol=pickle.HIGHEST_PROTOCOL)
        self.file.seek(self.size)
        self.file.write(data)
        self.file.write(meta)
        self.offset.append(self.size)
        self.n_in.append(n_in)
        self.n.append(len(seq))
        self.wide.append(wide)
        self.meta.append(len(meta))
        self.size += len(data) + len(meta)

    def _read(self, k: int) -> tuple[np.ndarray, int, bytes]:
        dtype = np.dtype(np.int64 if self.wide[k] else np.int32)
        self.file.seek(self.offset[k])
        data = self.file.read(self.n[k] * dtype.itemsize + self.meta[k])
        cut = self.n[k] * dtype.itemsize
        return np.frombuffer(data[:cut], dtype=dtype), self.n_in[k], data[cut:]

    def records(self, rows) -> list[dict]:
        """The rows' slim records, each with its row under `_row`."""
        out = []
        for k in rows:
            rec = pickle.loads(self._read(k)[2])
            rec["_row"] = k
            out.append(rec)
        return out

    def load(self, recs: list[dict]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per record (of `records`): (input ids, input + output ids), views of one array read back."""
        out = []
        for rec in recs:
            seq, n_in, _ = self._read(rec["_row"])
            out.append((seq[:n_in], seq))
        return out

    def close(self) -> None:
        self.file.close()


class _Index:
    """The index pass: how many candidates, references' places, the prefixes the links need."""

    def __init__(self, reader: RunReader, store: RowStore) -> None:
        self.n = 0
        self.refs: dict[str, tuple] = {}
        self.seen: set = set()
        self.stems = [s for s in reader.stems() if L.is_request_stem(s)]
        self.has_candidates = dict.fromkeys(self.stems, False)
        first: dict[tuple, int] = {}
        links: list[tuple[int, tuple, int, int]] = []  # (row, session, turn, cached) of the restored turns
        for stem in self.stems:
            for batch, s, g, rows in store.scan(stem, LINKS, self.seen, spill_role="reference"):
                data = batch.to_pydict()
                self.has_candidates[stem] |= "candidate" in data["role"]
                for i, role in enumerate(data["role"]):
                    if role == "candidate":
                        k = self.n
                        self.n += 1
                        session = tuple(_field(data, i, f) for f in ("pool", "concurrency", "session_id"))
                        turn, cached = _field(data, i, "turn"), int(_field(data, i, "cached_tokens") or 0)
                        first.setdefault((*session, turn), k)
                        if isinstance(turn, int) and turn > 0 and cached > 0:
                            links.append((k, session, turn, cached))
                    elif role == "reference":
                        self.refs.setdefault(str(_field(data, i, "input_hash")), (s, g, int(rows[i])))
        self.in_len: dict[int, int] = {}  # row -> length of its input prefix to digest
        self.seq_lens: dict[int, set[int]] = {}  # row -> lengths of its input + output prefixes to digest
        for k, session, turn, cached in links:
            self.in_len[k] = cached
            for t in range(turn):
                j = first.get((*session, t))
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
        chunks: list[pd.DataFrame] = []  # the frame's rows, a batch at a time, typed (reports/analyze.py)
        links = LinkIndex()  # what the restore links read of each row (reports/links.py)
        latency: list[pd.DataFrame] = []
        lost: Counter = Counter()
        groups: dict[tuple, array] = {}  # reports/tree_shapes.py point_of -> its rows, in frame order
        run_id = None
        k = 0
        seen: set = set()
        quiet = RunReader(run_dir)  # the token pass reads again: its warnings are the index pass's
        tstore = RowStore(quiet, 0)
        read = list(dict.fromkeys([*TOKENS, *SCALARS]))
        for stem in index.stems:
            if not index.has_candidates[stem]:  # its keys only, so that `seen` drops what the index pass dropped
                for _ in quiet.batches(stem, ["key"], seen):
                    pass
                continue
            for batch, _, _, _ in tstore.scan(stem, read, seen):
                roles = batch.column("role").to_pylist()
                mine = np.array([r == "candidate" for r in roles], dtype=bool)
                if not mine.any():
                    continue
                tb = batch.filter(pa.array(mine))
                data = {c: tb.column(c).to_pylist() for c in SCALARS}
                recs = [_scalars(data, i) for i in range(tb.num_rows)]
                ks = list(range(k, k + tb.num_rows))
                k += tb.num_rows
                batch_rows(tb, ks, recs, index, store, prompts, per_pool, (threshold, tolerance), cols, digests,
                           has_input, facts, spill, ladder_pools)
                if len(cols["key"]) >= CHUNK_ROWS:
                    links.add(cols)
                    chunks.append(chunk_frame(cols))
                    cols = {c: [] for c in REQUEST_COLUMNS}
                latency.append(request_latency(recs))
                for row, rec in zip(ks, recs, strict=True):
                    if rec.get("cache_lost"):
                        lost[rec["cache_lost"]] += 1
                    point = point_of(rec)
                    if point is not None:
                        groups.setdefault(point, array("q")).append(row)
                if run_id is None and recs:
                    run_id = recs[0].get("run_id")
        if cols["key"]:
            links.add(cols)
            chunks.append(chunk_frame(cols))
        stats = [r for stem in reader.stems() if not L.is_request_stem(stem)
                 for r in reader.records(stem, index.seen) if r.get("role") == "stats"]

        def on_path(i: int, j: int, length: int) -> bool:
            if not has_input.get(i, True) or not has_input.get(j, True):
                return True
            return digests[(i, -length)] == digests[(j, length)]

        crossings = [c for chunk in chunks for c in chunk["crossings"]]
        df = frames_joined(chunks, links.links(crossings.__getitem__, on_path))
        del crossings
        digests.clear()
        shapes = shapes_of_points((spill.records(rows) for rows in groups.values()), spill.load)
        return AnalyzedRun(df, latency=pd.concat(latency, ignore_index=True) if latency else request_latency([]),
                           run_id=run_id, cache_lost=lost, stats=stats, truncated=reader.truncated,
                           corrupt=reader.corrupt, duplicates=reader.duplicates, references=len(index.refs),
                           facts=facts, shapes=shapes)
    finally:
        store.close()
        spill.close()
