"""The token pass of reports/analyze_run.py over some request stems of a run directory: in this process, or as Ray
tasks on the cluster the run used (`--analyze-on-cluster`), one task per stem.

A pass reads its stems' candidates with their token columns a batch at a time and gives what the analysis keeps
of them (`Pass`): the frame's rows typed 8,192 at a time, what the restore links read of each row, the prefix
digests the links compare, the TokenFacts, latency rows, cache-lost counts, the rows of each tree-shape point,
and a spill of the rows' ids with what the tree shapes read of them. Passes over consecutive stems merge in
order into what one pass over all of them gives (`Pass.merge`), so a run analyzed on the cluster has every
output of one analyzed in one process. What a pass needs of the whole run comes from the index pass (`View`).
"""

from __future__ import annotations

import pickle
import tempfile
from array import array
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from records.lookup import RowStore
from records.reader import RunReader
from reports.analyze import REQUEST_COLUMNS, chunk_frame
from reports.analyze_batch import TOKENS, batch_rows
from reports.facts import TokenFacts
from reports.latency import request_latency
from reports.links import LinkIndex
from reports.release import release
from reports.row_values import PrefixDigests, RowLengths
from reports.seen_keys import KeyMap, SeenKeys
from reports.tree_shapes import point_of, slim

CHUNK_ROWS = 8192  # frame rows typed at once: a chunk of a few rows costs more than its rows (61 columns)


class Spill:
    """Each candidate row's input ids, input + output ids and what the tree shapes read of its record
    (reports/tree_shapes.py slim), written to a temporary file in the token pass and read back one sweep point at
    a time (rows are added in order, 0, 1, 2, ...)."""

    _I32 = np.iinfo(np.int32)

    def __init__(self, base: int = 0) -> None:
        self.base = base  # the row of its first entry
        self.file = tempfile.TemporaryFile(prefix="specgate-ids-")
        self.offset, self.n_in, self.n, self.wide, self.meta = array("q"), array("q"), array("q"), array("b"), \
            array("q")
        self.size = 0

    def add(self, k: int, ids, out_ids, rec: dict) -> None:
        assert k == self.base + len(self.offset), (k, self.base, len(self.offset))
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
        k -= self.base
        dtype = np.dtype(np.int64 if self.wide[k] else np.int32)
        self.file.seek(self.offset[k])
        data = self.file.read(self.n[k] * dtype.itemsize + self.meta[k])
        cut = self.n[k] * dtype.itemsize
        return np.frombuffer(data[:cut], dtype=dtype), self.n_in[k], data[cut:]

    def records(self, rows) -> list[dict]:
        """The rows' slim records, each with its row under `_row`."""
        out, shared = [], {}
        for k in rows:
            rec = pickle.loads(self._read(k)[2])
            rec["_row"] = k
            for name in ("engine", "case"):  # a few distinct small dicts, read only: one object each
                value = rec.get(name)
                if isinstance(value, dict):
                    rec[name] = shared.setdefault((name, repr(value)), value)
            out.append(rec)
        return out

    def load(self, recs: list[dict]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per record (of `records`): (input ids, input + output ids), views of one array read back."""
        out = []
        for rec in recs:
            seq, n_in, _ = self._read(rec["_row"])
            out.append((seq[:n_in], seq))
        return out

    def export(self) -> tuple:
        """Everything it holds, to be put after another spill's rows (`extend`): from another process or node."""
        self.file.seek(0)
        return self.file.read(self.size), self.offset, self.n_in, self.n, self.wide, self.meta

    def extend(self, exported: tuple) -> None:
        """Append an exported spill's rows (they follow this one's)."""
        data, offset, n_in, n, wide, meta = exported
        self.file.seek(self.size)
        self.file.write(data)
        self.offset.extend(o + self.size for o in offset)
        self.n_in.extend(n_in)
        self.n.extend(n)
        self.wide.extend(wide)
        self.meta.extend(meta)
        self.size += len(data)

    def close(self) -> None:
        self.file.close()


@dataclass
class View:
    """What a token pass needs of the whole run (from the index pass): where each reference and stored prompt is
    (as (source, row group, row) of `sources`), which prefixes of which rows the links compare, and per stem the
    keys an earlier stem already held (dropped as duplicates, as one reader over every stem drops them)."""

    sources: list[Path]
    refs: KeyMap  # input_hash -> (source, row group, row)
    prompts: KeyMap
    in_len: RowLengths  # row -> (its input prefix length to digest,)
    seq_lens: RowLengths  # row -> the lengths of its input + output prefixes to digest
    earlier: dict[str, set] = field(default_factory=dict)


@dataclass
class Pass:
    """What a token pass keeps (see the module doc); rows from `start` on."""

    start: int
    spill: Spill | tuple
    n: int = 0
    chunks: list[pd.DataFrame] = field(default_factory=list)
    links: LinkIndex = field(default_factory=LinkIndex)
    digests: PrefixDigests = field(default_factory=PrefixDigests)
    facts: TokenFacts = field(default_factory=TokenFacts)
    latency: list[pd.DataFrame] = field(default_factory=list)
    lost: Counter = field(default_factory=Counter)
    groups: dict[tuple, array] = field(default_factory=dict)  # tree-shape point -> its rows, in frame order
    run_id: str | None = None

    def merge(self, other: Pass) -> None:
        """Append a pass over the stems after this one's (its rows follow this one's)."""
        assert other.start == self.start + self.n, (other.start, self.start, self.n)
        if isinstance(other.spill, tuple):
            self.spill.extend(other.spill)
        self.n += other.n
        self.chunks += other.chunks
        self.links.extend(other.links)
        self.digests.extend(other.digests)
        self.facts.extend(other.facts)
        self.latency += other.latency
        self.lost.update(other.lost)
        for point, rows in other.groups.items():
            self.groups.setdefault(point, array("q")).extend(rows)
        self.run_id = self.run_id if self.run_id is not None else other.run_id


def token_pass(run_dir: Path, stems: list[str], start: int, view: View, scalars: Callable, scalar_columns: list[str],
               per_pool: Mapping[str, tuple], limits: tuple[float, float], ladder_pools: Callable | None,
               budget: int, spill: Spill | None = None) -> Pass:
    """The token pass over `stems` (in order), its first candidate row being `start`; `scalars(data, i)`: row i's
    scalar fields as its record has them (reports/analyze_run.py); `spill`: the spill to append to (else its
    own, exported into the Pass: for a pass in another process)."""
    own = spill is None
    out = Pass(start, Spill(start) if own else spill)
    reader = RunReader(run_dir)
    store = RowStore(reader, budget)
    store.adopt(view.sources)
    cols: dict[str, list] = {c: [] for c in REQUEST_COLUMNS}
    latency: list[pd.DataFrame] = []  # the batches' since the last chunk
    k = start
    read = list(dict.fromkeys([*TOKENS, *scalar_columns]))
    try:
        for stem in stems:
            seen = SeenKeys()  # the keys an earlier stem held, then this stem's
            seen.stem = ""
            for key in view.earlier.get(stem, ()):
                seen.add(key)
            seen.stem = stem
            for batch, _, _, _ in store.scan(stem, read, seen):
                roles = batch.column("role").to_pylist()
                mine = np.array([r == "candidate" for r in roles], dtype=bool)
                if not mine.any():
                    continue
                tb = batch.filter(pa.array(mine))
                data = {c: tb.column(c).to_pylist() for c in scalar_columns}
                recs = [scalars(data, i) for i in range(tb.num_rows)]
                ks = list(range(k, k + tb.num_rows))
                k += tb.num_rows
                batch_rows(tb, ks, recs, view, store, view.prompts, per_pool, limits, cols, out.digests, out.facts,
                           out.spill, ladder_pools)
                latency.append(request_latency(recs))
                if len(cols["key"]) >= CHUNK_ROWS:
                    out.links.add(cols)
                    out.chunks.append(chunk_frame(cols))
                    out.facts.share_keys(out.chunks[-1]["key"])  # the frame's keys: held once
                    cols = {c: [] for c in REQUEST_COLUMNS}
                    out.latency.append(pd.concat(latency, ignore_index=True))  # a frame per batch costs ~8 KB
                    latency = []
                    release()  # the chunk's lists and batches, freed: else the next chunk's arrays come on top
                for row, rec in zip(ks, recs, strict=True):
                    if rec.get("cache_lost"):
                        out.lost[rec["cache_lost"]] += 1
                    point = point_of(rec)
                    if point is not None:
                        out.groups.setdefault(point, array("q")).append(row)
                if out.run_id is None and recs:
                    out.run_id = recs[0].get("run_id")
        if cols["key"]:
            out.links.add(cols)
            out.chunks.append(chunk_frame(cols))
            out.facts.share_keys(out.chunks[-1]["key"])
        if latency:
            out.latency.append(pd.concat(latency, ignore_index=True))
        out.n = k - start
        if own:
            exported = out.spill.export()
            out.spill.close()
            out.spill = exported
        return out
    finally:
        store.close()


def cluster_passes(run_dir: Path, stems: list[str], starts: list[int], view: View, *args) -> Iterator[Pass]:
    """token_pass over each stem as a Ray task on the connected cluster (the run directory must be where every
    node reads it), all started at once, each result fetched in stem order when the caller asks for it (so that
    the caller holds one pass's result besides what it merged)."""
    import ray

    remote = ray.remote(num_cpus=1)(token_pass)
    shared = ray.put(view)
    refs = [remote.remote(run_dir, [stem], start, shared, *args) for stem, start in zip(stems, starts, strict=True)]
    for i in range(len(refs)):
        ref, refs[i] = refs[i], None
        yield ray.get(ref)


def connect_for_analysis(address: str) -> None:
    """Join the Ray cluster at `address` (HOST:PORT; auto: the one this node runs; local: a Ray of this machine's
    CPUs) for cluster_passes, unless this process is connected already."""
    import ray

    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)  # "local": always a new one
