"""Analyze a run directory in bounded memory: the requests frame of reports/analyze.py, streamed from the records.

`analyze_run(run_dir, ...)` gives the frame `analyze(load_run(run_dir).candidates, ...references)` gives, without
holding any record's token lists beyond one batch:

1. an index pass reads the candidates' scalar columns (records/reader.py batches), where each reference is
   (records/lookup.py), and which prefixes the restore links will compare;
2. a token pass per stem (reports/analyze_pass.py: here, or as Ray tasks on the cluster) reads the candidates'
   token columns a row group at a time, takes their references' rows (a byte-bounded cache of row groups),
   classifies the batch with reports/oracle_vec.py, computes verify crossings from `spec_trace` in numpy, and
   digests the prefixes the links compare; the passes merge in stem order;
3. the links (reports/links.py LinkIndex, link_restored_checkpoints' rules) compare digests instead of id lists;
4. the tree shapes (reports/tree_shapes.py) walk each sweep point's ids, spilled to a temporary file in the token
   pass and read back one point at a time.

The token pass also gathers the verdict's TokenFacts (reports/facts.py), each candidate's latency figures
(reports/latency.py) and what the tree shapes read of it (spilled with its ids). What it holds per candidate:
its frame row, latency row, digests and facts, where its reference is, and where its spill is; beyond that at
most `budget` bytes of row groups, one batch's records and one sweep point's spilled ids.
"""

from __future__ import annotations

import json
from array import array
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from records import layout as L
from records.columns import FIELDS
from records.lookup import RowStore
from records.reader import RunReader
from reports.analyze import frames_joined
from reports.analyze_batch import ORACLE_FIELDS
from reports.analyze_pass import Pass, Spill, View, cluster_passes, connect_for_analysis, token_pass
from reports.crossing_cells import crossing_list
from reports.facts import TokenFacts
from reports.latency import request_latency
from reports.oracle import DRIFT_TOLERANCE, MARGIN_THRESHOLD
from reports.release import release
from reports.row_values import RowLengths
from reports.seen_keys import KeyMap, SeenKeys
from reports.tree_shapes import shapes_of_points
from reports.window import WINDOW_LISTS

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


class _Index:
    """The index pass: candidates per stem, references' places, the prefixes the links need."""

    def __init__(self, reader: RunReader, store: RowStore) -> None:
        self.n = 0
        self.refs = KeyMap(3)  # input_hash -> where its reference is: (source, row group, row)
        self.seen = SeenKeys()
        self.stems = [s for s in reader.stems() if L.is_request_stem(s)]
        self.counts = dict.fromkeys(self.stems, 0)  # candidates per stem
        sessions: dict[tuple, int] = {}  # (pool, concurrency, session id) -> its number
        turns = _Turns()  # every candidate's (session, turn) with an integer turn
        links = _Turns()  # the restored turns: (session, turn), row, cached tokens
        for stem in self.stems:
            self.seen.stem = stem
            for batch, s, g, rows in store.scan(stem, LINKS, self.seen, spill_role="reference"):
                data = batch.to_pydict()
                for i, role in enumerate(data["role"]):
                    if role == "candidate":
                        k = self.n
                        self.n += 1
                        self.counts[stem] += 1
                        session = tuple(_field(data, i, f) for f in ("pool", "concurrency", "session_id"))
                        sid = sessions.setdefault(session, len(sessions))
                        turn, cached = _field(data, i, "turn"), int(_field(data, i, "cached_tokens") or 0)
                        turns.add(sid, turn, k)
                        if isinstance(turn, int) and turn > 0 and cached > 0:
                            links.add(sid, turn, k, cached)
                    elif role == "reference":
                        self.refs.setdefault(str(_field(data, i, "input_hash")), (s, g, int(rows[i])))
        self.seen.stem = ""
        sessions.clear()
        # row -> (length of its input prefix to digest,): links are in row order
        self.in_len = RowLengths(links.row, ((c,) for c in links.cached))
        self.seq_lens = turns.earlier_turns(links)  # row -> lengths of its input + output prefixes to digest


def _points(spill: Spill, groups) -> Iterator[list[dict]]:
    """Each tree-shape point's spilled records, read when the walk comes to it (the last point's freed)."""
    for rows in groups:
        release()
        yield spill.records(rows)


class _Turns:
    """(session number, turn, row[, cached tokens]) per candidate, as arrays; a turn that is not an integer
    (None, text) is never an earlier turn and is left out (an integral float counts as its integer, as a dict key
    would)."""

    def __init__(self) -> None:
        self.session, self.turn, self.row, self.cached = array("q"), array("q"), array("q"), array("q")

    def add(self, session: int, turn, row: int, cached: int = 0) -> None:
        if isinstance(turn, float) and turn.is_integer():
            turn = int(turn)
        if not isinstance(turn, int) or not 0 <= turn < 1 << 31:
            return
        self.session.append(session)
        self.turn.append(turn)
        self.row.append(row)
        self.cached.append(cached)

    def _codes(self) -> np.ndarray:
        return (np.array(self.session, np.int64) << 31) | np.array(self.turn, np.int64)

    def earlier_turns(self, links: _Turns) -> RowLengths:
        """Per row: the cached token counts of the restored turns (`links`) that come after it in its session,
        it being its session's first row with that turn."""
        codes = self._codes()
        order = np.argsort(codes, kind="stable")
        unique, first = np.unique(codes[order], return_index=True)
        first_row = np.array(self.row, np.int64)[order][first]
        turns = np.array(links.turn, np.int64)  # each link asks for turns 0 .. turn - 1 of its session
        at = np.repeat(np.cumsum(turns) - turns, turns)
        want = (np.repeat(np.array(links.session, np.int64), turns) << 31) | (np.arange(int(turns.sum())) - at)
        cached = np.repeat(np.array(links.cached, np.int64), turns)
        pos = np.minimum(np.searchsorted(unique, want), max(len(unique) - 1, 0))
        hit = (pos < len(unique)) & (unique[pos] == want) if len(unique) else np.zeros(len(want), bool)
        pairs = np.unique(np.stack([first_row[pos[hit]], cached[hit]], axis=1), axis=0) if hit.any() else \
            np.zeros((0, 2), np.int64)
        rows, starts = np.unique(pairs[:, 0], return_index=True)
        return RowLengths(rows.tolist(), [part.tolist() for part in np.split(pairs[:, 1], starts[1:])] if len(rows)
                          else [])


def analyze_run(run_dir: str | Path, threshold: float = MARGIN_THRESHOLD, tolerance: float = DRIFT_TOLERANCE,
                per_pool: Mapping[str, tuple] | None = None, budget: int = 64 << 20,
                ladder_pools: Callable[[str], bool] | None = None, cluster: str | None = None) -> AnalyzedRun:
    """The requests frame of `run_dir` (equal to reports.analyze.analyze over load_run's records), streamed;
    `per_pool` as in analyze; `budget`: bytes of reference and prompt row groups kept for reuse; `ladder_pools`:
    the pools whose candidates' ladder sums the facts hold (TokenFacts.of's); `cluster`: the token pass as Ray
    tasks on this Ray cluster (an address, auto, or local; a connected one is used as it is), a task per stem
    (reports/analyze_pass.py), the same outputs."""
    per_pool = per_pool or {}
    run_dir = Path(run_dir)
    reader = RunReader(run_dir)
    if cluster is not None and reader.layout.journals:
        raise ValueError(f"{run_dir}: the analysis on the cluster reads compacted records only; compact them first "
                         f"(python -m records.compact {run_dir})")
    store = RowStore(reader, budget)
    spill = Spill()
    try:
        index = _Index(reader, store)
        stats = [r for stem in reader.stems() if not L.is_request_stem(stem)
                 for r in reader.records(stem, index.seen) if r.get("role") == "stats"]
        index.seen.clear()  # every key met: what the token pass needs of it is in `earlier`
        prompts = store.prompt_index(KeyMap(3))  # numbers the prompt files: before the sources are handed on
        view = View(list(store.sources), index.refs, prompts, index.in_len, index.seq_lens, index.seen.earlier)
        release()  # the index pass's transients: the token pass's chunks fill what it leaves behind
        stems = [s for s in index.stems if index.counts[s]]
        starts = list(np.cumsum([0] + [index.counts[s] for s in stems[:-1]])) if stems else []
        args = (_scalars, SCALARS, per_pool, (threshold, tolerance), ladder_pools, budget)
        total = Pass(0, spill)
        if cluster is not None:
            connect_for_analysis(cluster)
            for part in cluster_passes(run_dir, stems, [int(s) for s in starts], view, *args):
                total.merge(part)
        else:
            for stem, start in zip(stems, starts, strict=True):
                total.merge(token_pass(run_dir, [stem], int(start), view, *args, spill=spill))
                release()
        references = len(index.refs)
        index = view = prompts = None  # the token pass's own: what follows holds the frame's worth at once
        digests = total.digests

        def on_path(i: int, j: int, length: int) -> bool:
            if not digests.has_input(i) or not digests.has_input(j):
                return True
            return digests[(i, -length)] == digests[(j, length)]

        starts = np.cumsum([0] + [len(c) for c in total.chunks])

        def crossings(j: int) -> list[dict]:
            c = int(np.searchsorted(starts, j, side="right")) - 1
            return crossing_list(total.chunks[c]["crossings"].iat[j - int(starts[c])])

        links = total.links.links(crossings, on_path)
        total.links = None
        digests.clear()
        df = frames_joined(total.chunks, links)
        total.chunks.clear()  # joined: each chunk's own copy is freed before the tree shapes walk
        release()
        latency = pd.concat(total.latency, ignore_index=True) if total.latency else request_latency([])
        total.latency.clear()
        shapes = shapes_of_points(_points(spill, total.groups.values()), spill.load)
        release()
        return AnalyzedRun(df, latency=latency, run_id=total.run_id, cache_lost=total.lost, stats=stats,
                           truncated=reader.truncated, corrupt=reader.corrupt, duplicates=reader.duplicates,
                           references=references, facts=total.facts, shapes=shapes)
    finally:
        store.close()
        spill.close()
