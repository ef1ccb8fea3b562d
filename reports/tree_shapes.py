"""Tree shapes: where a restored request's prefix match ended in the cache's radix tree, from the records alone.

A record says what a request restored (`cached_tokens`, d > 0) and which tokens it sent; the requests that
finished on the same replica in the same sweep point before it started say what the cache could hold (their
input + output ids). Put those sequences in a token trie and walk the request's input (all but its last
token, which a match always leaves to run). The request *branches off* an earlier sequence at depth D when it
leaves it inside it; a *split* is a depth where two earlier sequences part. Then, per restored request:

* `checkpoint`: it branches off nothing deeper than d: the match ended at the checkpoint it restored (a turn
  continuing its own history, or a branch exactly at a checkpoint);
* `split`: a split lies in (d, D] with a branch going on along the request past it: the match went through
  (or ended at) the node that split created, which holds no checkpoint of its own, and fell back to an
  ancestor's (a branch the request only continues past the split is no branch: had the cache held more than
  d tokens of it, the request would have restored more);
* `deeper`: D > d with no split in between: the match went into an edge past the checkpoint it restored;
* `sibling` (besides one of the three): no earlier request of its own session holds its first d tokens, so
  the checkpoint came from another session's branch.

An engine caches a sequence only up to its checkpoints (SGLang and the built-in engine keep no KV past a
request's last one), and matches whole pages: a branch past the last checkpoint of the sequence it leaves,
or less than a page past d, counts here although the tree could not have matched it. The workload's design
(`meta["tree_shapes"]`, one list per turn) is reported beside what the records show.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import numpy as np
import pandas as pd
import pyarrow as pa

from records.schema import sweep_point_of
from reports.oracle import FLAGGED

SHAPES = ("checkpoint", "split", "deeper", "sibling")  # the first three partition the restored requests
SHAPE_COLUMNS = ["interval", "shape", "requests", "flagged", "designed", "designed_reached", "by_concurrency"]


class _Node:
    __slots__ = ("children", "edge")

    def __init__(self, edge: np.ndarray, children: dict[int, _Node] | None = None) -> None:
        self.edge = edge  # tokens on the edge into this node (a view of an inserted sequence)
        self.children = children if children is not None else {}  # first token of a child's edge -> child


def _ids(seq) -> np.ndarray:
    return seq if isinstance(seq, np.ndarray) else np.asarray(list(seq), dtype=np.int64)


class TokenTrie:
    """A compressed trie of token sequences: where a query leaves them, and where they part from each other.
    Edges are views of the inserted arrays (token ids as numpy arrays; lists are converted)."""

    def __init__(self) -> None:
        self.root = _Node(np.zeros(0, dtype=np.int64))

    def insert(self, seq) -> None:
        """Add a sequence (splitting the edge where it leaves an existing one)."""
        seq = _ids(seq)
        node, pos = self.root, 0
        while pos < len(seq):
            first = int(seq[pos])
            child = node.children.get(first)
            if child is None:  # its own copy: a view would hold the whole sequence for its last tokens
                node.children[first] = _Node(seq[pos:].copy())
                return
            m = _common(child.edge, seq, pos)
            if m < len(child.edge):  # split: the upper part keeps the shared tokens
                upper = _Node(child.edge[:m], {int(child.edge[m]): child})
                child.edge = child.edge[m:]
                node.children[first] = upper
                child = upper
            node, pos = child, pos + m

    def walk(self, query) -> tuple[int, list[int], bool]:
        """(D, splits, inside): D is the deepest point where `query` leaves an earlier sequence (inside it, or at a
        split where it takes another branch; 0 if none), `splits` the depths of splits on its path up to where it
        stops, `inside` whether it stops inside sequences that go on (False: it continues past a sequence's end)."""
        query = _ids(query)
        node, pos, splits = self.root, 0, []
        while True:
            if len(node.children) > 1 and pos > 0:
                splits.append(pos)
            child = node.children.get(int(query[pos])) if pos < len(query) else None
            if child is None:  # stops at a node: inside the sequences going on from it, or past an end
                return (pos, splits, True) if node.children else (max(splits, default=0), splits, False)
            m = _common(child.edge, query, pos)
            if m < len(child.edge):  # stops inside an edge: the sequences below go on
                return pos + m, splits, True
            node, pos = child, pos + m


def _common(edge: np.ndarray, seq: np.ndarray, pos: int) -> int:
    """Length of the common prefix of `edge` and `seq[pos:]`."""
    limit = min(len(edge), len(seq) - pos)
    if limit <= 0:
        return 0
    differ = edge[:limit] != seq[pos:pos + limit]
    first = int(differ.argmax())
    return first if differ[first] else limit


def _shape(d: int, depth: int, splits: list[int], inside: bool) -> str | None:
    """The shape of a restore of d tokens by a request that leaves earlier sequences at `depth` (see walk).

    A split counts when a branch of it goes on along the request past it: one the request leaves deeper, or
    one of the split's own branches where the request stops at the split. Where the request only continues
    sequences past the split, those are the ones it restored (at most d of theirs is cached, or it would have
    restored more), so that branch is not in the tree and the split is none.
    """
    if d <= 0:
        return None
    real = [s for s in splits if s < depth or (inside and s == depth)]
    if any(d < s <= depth for s in real):
        return "split"
    return "deeper" if depth > d else "checkpoint"


Loader = Callable[[list[dict]], list[tuple[np.ndarray, np.ndarray]]]


def record_ids(recs: list[dict]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per record, its input ids and what it left for the cache to hold (input ids, then output ids)."""
    out = []
    for r in recs:
        ids = _ids(r.get("input_ids") or [])
        out.append((ids, np.concatenate([ids, _ids(r.get("output_ids") or [])])))
    return out


def point_of(rec: dict) -> tuple | None:
    """The (pool, sweep point, replica) whose requests a candidate record is walked with; None: not walked
    (not a candidate, or never sent)."""
    if rec.get("role", "candidate") != "candidate" or rec.get("t_start") is None:
        return None
    return rec.get("pool"), sweep_point_of(rec.get("key"), rec.get("concurrency")), rec.get("replica_id")


def slim(rec: dict) -> dict:
    """What _point_shapes reads of a record (a stand-in for it when records are spilled: reports/analyze_run.py)."""
    out = {name: rec.get(name) for name in ("key", "interval", "concurrency", "session_id", "turn", "cached_tokens",
                                           "t_start", "e2e", "error")}
    engine, case = rec.get("engine") or {}, rec.get("case") or {}
    out["engine"] = {"radix_cache": engine["radix_cache"]} if "radix_cache" in engine else {}
    out["case"] = {"tree_shapes": case["tree_shapes"]} if "tree_shapes" in case else {}
    return out


def request_shapes(candidates: list[dict], ids_of: Loader = record_ids) -> pd.DataFrame:
    """One row per answered candidate: key, interval, concurrency, shape (None: restored nothing), sibling,
    the depth it branches off at, and the shapes its case was designed to reach. `ids_of` gives the token ids
    of the records it is given, as the walk of one sweep point on one replica comes to them (default: the
    records' own `input_ids` and `output_ids`)."""
    points: dict[tuple, list[dict]] = defaultdict(list)
    for rec in candidates:
        point = point_of(rec)
        if point is not None:
            points[point].append(rec)
    return shapes_of_points(points.values(), ids_of)


def shapes_of_points(points, ids_of: Loader = record_ids) -> pd.DataFrame:
    """request_shapes of records already grouped by point_of (an iterable of lists, in first-record order)."""
    cols = _Columns()
    for recs in points:
        _point_shapes(recs, ids_of, cols)
        del recs  # walked: a point's records loaded one at a time are freed before the next point's are loaded
    return cols.frame()


_ROW = ["key", "interval", "concurrency", "shape", "sibling", "branch", "designed"]


class _Columns:
    """The rows' columns as they are walked. A run's keys become Arrow text a point at a time and equal design
    lists are one list, so that what a million rows leave behind is not a million small objects."""

    def __init__(self) -> None:
        self.cols: dict[str, list] = {c: [] for c in _ROW if c != "key"}
        self.keys: list = []  # Arrow text per point (a list where a key is not text)
        self.pending: list = []
        self.designs: dict[tuple, list] = {}

    def add(self, key, interval, concurrency, shape, sibling, branch, designed: list) -> None:
        self.pending.append(key)
        try:
            designed = self.designs.setdefault(tuple(designed), designed)
        except TypeError:  # a design that is not a list of names: kept as it is
            pass
        for c, v in zip(_ROW[1:], (interval, concurrency, shape, sibling, branch, designed), strict=True):
            self.cols[c].append(v)

    def end_point(self) -> None:
        if self.pending:
            text = all(k is None or isinstance(k, str) for k in self.pending)
            self.keys.append(pa.array(self.pending, pa.string()) if text else self.pending)
            self.pending = []

    def frame(self) -> pd.DataFrame:
        self.end_point()
        if not self.keys:
            return pd.DataFrame({c: [] for c in _ROW}, columns=_ROW)
        if all(isinstance(k, pa.Array) for k in self.keys):
            key = pd.Series(pa.chunked_array(self.keys, pa.string()), dtype="str")
        else:  # as pandas makes a column of them
            key = pd.Series([k for part in self.keys for k in (part.to_pylist() if isinstance(part, pa.Array)
                                                               else part)])
        return pd.DataFrame({"key": key, **self.cols}, columns=_ROW)


def _point_shapes(recs: list[dict], ids_of: Loader, cols: _Columns) -> None:
    """Append the shapes of one sweep point's requests on one replica to `cols`, walking them in the order they
    were sent."""
    ok = [r for r in recs if r.get("error") is None and r.get("e2e") is not None]

    def seq(q: dict) -> np.ndarray:  # loaded when needed: a point's ids at once are most of a run's tokens
        return ids_of([q])[0][1]

    ends = sorted(ok, key=lambda r: r["t_start"] + r["e2e"])
    sessions: dict[str, list[dict]] = defaultdict(list)
    for q in ok:
        sessions[q.get("session_id")].append(q)
    trie, done = TokenTrie(), 0
    for r in sorted(ok, key=lambda r: r["t_start"]):
        while done < len(ends) and ends[done]["t_start"] + ends[done]["e2e"] <= r["t_start"]:
            trie.insert(seq(ends[done]))
            done += 1
        d, ids = int(r.get("cached_tokens") or 0), ids_of([r])[0][0]
        depth, splits, inside = trie.walk(ids[:-1]) if len(ids) > 1 else (0, [], False)
        own = [q for q in sessions[r.get("session_id")] if q["t_start"] < r["t_start"]]
        sibling = d > 0 and not any(np.array_equal(seq(q)[:d], ids[:d]) for q in own)
        # a pool without a prefix cache (a speculation-only control or --diagnose pool) cannot reach a shape its
        # case was designed for: the design is not its to miss
        caching = (r.get("engine") or {}).get("radix_cache") is not False
        designed = ((r.get("case") or {}).get("tree_shapes") or []) if caching else []
        turn = r.get("turn")
        cols.add(r["key"], r.get("interval"), r.get("concurrency"), _shape(d, depth, splits, inside), sibling, depth,
                 list(designed[turn]) if isinstance(turn, int) and turn < len(designed) else [])
    cols.end_point()


def shapes_table(shapes: pd.DataFrame, df: pd.DataFrame) -> pd.DataFrame:
    """interval x shape: restored requests of that shape, how many flagged, designed, designed and reached, and
    the requests per concurrency (`1:2 4:2`)."""
    if shapes.empty:
        return pd.DataFrame(columns=SHAPE_COLUMNS)
    flagged = set(df.loc[df["class"].isin(FLAGGED), "key"]) if len(df) else set()
    rows = []
    for interval, mine in sorted(shapes.dropna(subset=["interval"]).groupby("interval"), key=lambda kv: kv[0]):
        for shape in SHAPES:
            hit = mine["sibling"] if shape == "sibling" else mine["shape"] == shape
            designed = mine["designed"].map(lambda ds, shape=shape: shape in ds)
            reached = mine[hit]
            per = reached.groupby("concurrency").size()
            rows.append({"interval": int(interval), "shape": shape, "requests": int(hit.sum()),
                         "flagged": int(reached["key"].isin(flagged).sum()), "designed": int(designed.sum()),
                         "designed_reached": int((designed & hit).sum()),
                         "by_concurrency": " ".join(f"{int(c)}:{n}" for c, n in per.items())})
    return pd.DataFrame(rows, columns=SHAPE_COLUMNS)
