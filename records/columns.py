"""Records as Arrow columns (docs/records.md, "At rest"): one typed column per record field, prompts apart.

`RecordColumns` turns record dicts into an Arrow RecordBatch of REQUEST_SCHEMA and back, exactly: a value
is put in its typed column only when it has that column's JSON type (an int for an int column, a float
for a float column, a list of ints that fit int32 for token ids, ...); anything else, and any field the
schema does not know, is kept verbatim in `_extra` (a JSON object), and fields a record lacks are listed
in `_absent`, so that every record reads back with the same contents. The one loss is precision, and only
in log-probs, which are stored as float32 (`output_logprobs` and the log-probs of `output_top_logprobs`).
`input_ids` are stored once per distinct input by the caller's prompt store (records/compact.py): the
column `input_ids` holds a record's ids only where they are not the stored prompt of its `input_hash`.
Records of other journals (stats) are kept as one JSON text each (GENERIC_SCHEMA).

Other packages read stored rows through this module's public functions, never through the columns the layout
keeps for itself (`_extra`, `_absent`, the split top-k): `stored_columns(fields)` names what to read for some
record fields, `overrides(batch)` says where each row departs from its typed columns, `rows_as_records` and
`row_as_record` give fields as the records have them, `top_k_columns` the two columns of the top-k and
`null_columns` a table of null rows.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import pyarrow as pa

INT32 = (-(1 << 31), (1 << 31) - 1)
INT64 = (-(1 << 63), (1 << 63) - 1)

# field -> kind, in the order build_record writes them (records/schema.py); a read record has this order
FIELDS = {
    "schema": "int", "run_id": "str", "key": "str", "role": "str", "pool": "str", "engine": "json",
    "interval": "int", "concurrency": "int", "replica_id": "str", "node_id": "str", "suite": "str",
    "case_id": "str", "session_id": "str", "turn": "int", "case": "json", "input_hash": "str", "input_len": "int",
    "input_ids": "ids", "max_new_tokens": "int", "output_ids": "ids", "output_text": "str",
    "output_logprobs": "logprobs", "output_top_logprobs": "topk", "cached_tokens": "int",
    "completion_tokens": "int", "finish_reason": "str", "spec_verify_ct": "int", "spec_accept_length": "float",
    "spec_trace": "trace", "ttft": "float", "itl": "float", "e2e": "float", "t_start": "float", "retries": "int",
    "error": "str", "tokenizer": "str", "cache_lost": "str",
}
_ARROW = {"int": pa.int64(), "str": pa.string(), "json": pa.string(), "float": pa.float64(),
          "ids": pa.list_(pa.int32()), "logprobs": pa.list_(pa.float32()), "trace": pa.list_(pa.list_(pa.int32()))}
# output_top_logprobs is stored split: per token, the top-k log-probs and the top-k token ids
TOP_LOGPROBS, TOP_IDS = "top_logprobs", "top_ids"
REQUEST_SCHEMA = pa.schema(
    [pa.field(f, _ARROW[k]) for f, k in FIELDS.items() if k != "topk"]
    + [pa.field(TOP_LOGPROBS, pa.list_(pa.list_(pa.float32()))), pa.field(TOP_IDS, pa.list_(pa.list_(pa.int32()))),
       pa.field("_extra", pa.string()), pa.field("_absent", pa.list_(pa.string()))])
GENERIC_SCHEMA = pa.schema([pa.field("key", pa.string()), pa.field("role", pa.string()),
                            pa.field("json", pa.string())])
PROMPT_SCHEMA = pa.schema([pa.field("input_hash", pa.string()), pa.field("fingerprint", pa.binary()),
                           pa.field("input_ids", pa.list_(pa.int32()))])


def _int(v, lo_hi=INT64) -> bool:
    return type(v) is int and lo_hi[0] <= v <= lo_hi[1]


def is_ids(v) -> bool:
    """A list of ints that fit int32 (token ids as JSON gives them)."""
    return type(v) is list and set(map(type, v)) <= {int} and (not v or (min(v) >= INT32[0] and max(v) <= INT32[1]))


def _floats(v) -> bool:
    return type(v) is list and set(map(type, v)) <= {float}


def _topk(v) -> tuple[list, list] | None:
    """(log-probs, ids) per token of `[[[logprob, id], ...], ...]`, or None when it has another shape."""
    if type(v) is not list or set(map(type, v)) - {list}:
        return None
    entries = [e for tok in v for e in tok]
    if set(map(type, entries)) - {list} or set(map(len, entries)) - {2}:
        return None
    lps, ids = [e[0] for e in entries], [e[1] for e in entries]
    if not (_floats(lps) and is_ids(ids)):
        return None
    out_l, out_i, at = [], [], 0
    for tok in v:
        out_l.append(lps[at:at + len(tok)])
        out_i.append(ids[at:at + len(tok)])
        at += len(tok)
    return out_l, out_i


def _trace(v) -> bool:
    if type(v) is not list or set(map(type, v)) - {list}:
        return False
    flat = [x for step in v for x in step]
    return set(map(type, flat)) <= {int, type(None)} and all(x is None or _int(x, INT32) for x in flat)


_FITS: dict[str, Callable] = {"int": _int, "str": lambda v: type(v) is str, "float": lambda v: type(v) is float,
                              "ids": is_ids, "logprobs": _floats, "trace": _trace}


def to_batch(records: list[dict], inline_ids: Callable[[dict], bool]) -> pa.RecordBatch:
    """REQUEST_SCHEMA columns of `records`; `inline_ids(rec)` says whether a record's input_ids go in its own
    column (False: they are its input_hash's stored prompt)."""
    cols: dict[str, list] = {f.name: [] for f in REQUEST_SCHEMA}
    for rec in records:
        extra, absent = {}, []
        for name, kind in FIELDS.items():
            if name not in rec:
                absent.append(name)
                if kind == "topk":
                    cols[TOP_LOGPROBS].append(None)
                    cols[TOP_IDS].append(None)
                else:
                    cols[name].append(None)
                continue
            v = rec[name]
            if kind == "topk":
                split = _topk(v) if v is not None else None
                if split is None and v is not None:
                    extra[name] = v
                cols[TOP_LOGPROBS].append(split[0] if split else None)
                cols[TOP_IDS].append(split[1] if split else None)
            elif kind == "json":
                cols[name].append(json.dumps(v, separators=(",", ":")))
            elif name == "input_ids" and v is not None and is_ids(v) and not inline_ids(rec):
                cols[name].append(None)  # the stored prompt of its input_hash
            elif v is None or _FITS[kind](v):
                if v is None and name == "input_ids":
                    extra[name] = None  # null ids, not the prompt store's
                cols[name].append(v)
            else:
                extra[name] = v
                cols[name].append(None)
        for name in rec:
            if name not in FIELDS:
                extra[name] = rec[name]
        cols["_extra"].append(json.dumps(extra, separators=(",", ":")) if extra else None)
        cols["_absent"].append(absent or None)
    return pa.RecordBatch.from_pydict(cols, schema=REQUEST_SCHEMA)


def pylist(arr: pa.Array | pa.ChunkedArray, pairs_with: pa.Array | None = None) -> list:
    """`arr.to_pylist()`, several times faster for (nested) list columns: the flat values go to Python in one
    numpy call and are cut by the offsets. `pairs_with`: a second list<list<>> column of the same shape; the
    innermost values become [a, b] pairs (the top-k entries)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
        pairs_with = pairs_with.combine_chunks() if isinstance(pairs_with, pa.ChunkedArray) else pairs_with
    if not pa.types.is_list(arr.type):
        if pairs_with is None:
            return arr.to_numpy(zero_copy_only=False).tolist() if arr.null_count == 0 and pa.types.is_primitive(
                arr.type) else arr.to_pylist()
        return list(map(list, zip(pylist(arr), pylist(pairs_with), strict=True)))
    inner = pylist(arr.values, pairs_with.values if pairs_with is not None else None)
    cuts = arr.offsets.to_numpy().tolist()
    out = [inner[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]
    if arr.null_count:
        out = [None if null else v for v, null in zip(out, arr.is_null().to_pylist(), strict=True)]
    return out


def from_batch(batch: pa.RecordBatch | pa.Table, prompt: Callable[[str], list[int]]) -> list[dict]:
    """The record dicts of a REQUEST_SCHEMA batch; `prompt(input_hash)` gives a stored prompt's ids."""
    names = set(batch.schema.names) - {TOP_LOGPROBS, TOP_IDS}
    data = {name: pylist(batch.column(name)) for name in names}
    data["topk"] = pylist(batch.column(TOP_LOGPROBS), batch.column(TOP_IDS))
    out = []
    for i in range(batch.num_rows):
        extra = json.loads(data["_extra"][i]) if data["_extra"][i] is not None else {}
        absent = set(data["_absent"][i] or ())
        rec = {}
        for name, kind in FIELDS.items():
            if name in absent:
                continue
            if name in extra:
                rec[name] = extra[name]
            elif kind == "topk":
                rec[name] = data["topk"][i]
            elif kind == "json":
                rec[name] = json.loads(data[name][i])
            elif name == "input_ids" and data[name][i] is None:
                rec[name] = prompt(data["input_hash"][i])
            else:
                rec[name] = data[name][i]
        for name, v in extra.items():
            if name not in FIELDS:
                rec[name] = v
        out.append(rec)
    return out


def generic_batch(records: list[dict]) -> pa.RecordBatch:
    """GENERIC_SCHEMA rows: each record's key and role (None where not a string) beside its whole JSON text."""
    def text(rec: dict, name: str) -> str | None:
        v = rec.get(name)
        return v if type(v) is str else None

    return pa.RecordBatch.from_pydict({"key": [text(r, "key") for r in records],
                                       "role": [text(r, "role") for r in records],
                                       "json": [json.dumps(r, separators=(",", ":")) for r in records]},
                                      schema=GENERIC_SCHEMA)


# the columns that say where a row departs from its typed columns (to_batch)
_OVERRIDE_COLUMNS = ["_extra", "_absent"]


def stored_columns(fields: Iterable[str]) -> list[str]:
    """The stored columns to read for these record fields, in their order (`output_top_logprobs`: its two split
    columns), then the two that say where a row departs from them (what `overrides` and the readers below read)."""
    out: list[str] = []
    for name in fields:
        out += [TOP_LOGPROBS, TOP_IDS] if FIELDS.get(name) == "topk" else [name]
    return out + _OVERRIDE_COLUMNS


def top_k_columns(batch: pa.RecordBatch | pa.Table) -> tuple[pa.Array, pa.Array]:
    """The stored `output_top_logprobs` of a batch: per token, its top-k log-probs and its top-k token ids."""
    return batch.column(TOP_LOGPROBS), batch.column(TOP_IDS)


def null_columns(columns: list[str], rows: int) -> pa.Table:
    """A table of `rows` null rows of these stored columns (their REQUEST_SCHEMA types)."""
    return pa.table({c: pa.nulls(rows, REQUEST_SCHEMA.field(c).type) for c in columns})


@dataclass(frozen=True)
class Overrides:
    """Where one stored row departs from its typed columns: `values`, the fields kept verbatim (a value not of its
    column's type, a field the schema does not know, such as the restore window's), and `absent`, the fields its
    record lacks."""

    values: dict
    absent: frozenset[str]


def overrides(batch: pa.RecordBatch | pa.Table) -> list[Overrides]:
    """Each row's Overrides (the batch holds the columns `stored_columns` adds)."""
    extras, absents = batch.column("_extra").to_pylist(), batch.column("_absent").to_pylist()
    return [Overrides(json.loads(e) if e is not None else {}, frozenset(a or ())) for e, a in zip(extras, absents,
                                                                                                   strict=True)]


def rows_as_records(batch: pa.RecordBatch | pa.Table, names: list[str],
                    over: list[Overrides] | None = None) -> list[dict]:
    """Every row's record fields `names` (typed columns of the batch, not `output_top_logprobs`) as its record has
    them: a value kept verbatim put back, a field the record lacks left out, JSON fields parsed. `over`: the
    batch's `overrides`, when already read. A null `input_ids` is the stored prompt of `input_hash`."""
    over = overrides(batch) if over is None else over
    data = batch.select(names).to_pydict()
    out = []
    for i, ov in enumerate(over):
        rec = {}
        for name in names:
            if name in ov.values:
                rec[name] = ov.values[name]
            elif name not in ov.absent:
                rec[name] = json.loads(data[name][i]) if FIELDS.get(name) == "json" else data[name][i]
        out.append(rec)
    return out


def row_as_record(batch: pa.RecordBatch | pa.Table, i: int, names: Iterable[str], ov: Overrides) -> dict:
    """Row i's record fields `names` as its record has them (`rows_as_records` for one row, where
    `output_top_logprobs` is rebuilt from its two columns as `[[logprob, id], ...]` per token); `ov`: the row's
    Overrides."""
    rec = {}
    for name in names:
        if name in ov.values:
            rec[name] = ov.values[name]
        elif name in ov.absent:
            continue
        elif FIELDS.get(name) == "topk":
            lps, ids = (c[i].as_py() for c in top_k_columns(batch))
            rec[name] = None if lps is None else [[list(e) for e in zip(a, b, strict=True)] for a, b in zip(
                lps, ids, strict=True)]
        elif FIELDS.get(name) == "json":
            rec[name] = json.loads(batch.column(name)[i].as_py())
        else:
            rec[name] = batch.column(name)[i].as_py()
    return rec
