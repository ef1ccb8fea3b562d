"""Analyze a run: classify every candidate record (reports/oracle.py) and attribute it to boundaries.

DESIGN.md 3.3. The result is the requests frame (REQUEST_COLUMNS), one row per
candidate. Positions are 0-based sequence indices: output token p sits at
sequence index `input_len + p`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from protocol.boundaries import boundaries_between, boundary_step, crossed_boundary, nearest_boundary_offset
from reports.crossing_cells import crossings_json
from reports.envelope import Envelope
from reports.links import OnPath, link_restored_checkpoints, seqs_on_path
from reports.oracle import DRIFT_TOLERANCE, MARGIN_THRESHOLD, Classification, classify
from reports.release import release

# requests.csv columns, in order (documented in docs/reports.md).
REQUEST_COLUMNS = [
    "key", "run_id", "pool", "variant", "interval", "concurrency", "block_size", "fault", "replica_id", "suite",
    "group", "case_id", "session_id", "turn", "input_hash", "input_len", "output_len", "ref_output_len",
    "class", "detail", "oracle", "drift", "drift_before_flip", "drift_onset", "drift_onset_pos",
    "drift_onset_offset", "drift_compared", "onset_points_at", "first_divergence", "divergence_pos",
    "divergence_offset", "ref_margin",
    "cand_rank", "cand_token", "ref_token", "cached_tokens", "restored", "restored_offset",
    "prompt_offset", "crossing_source", "crossed_boundaries", "n_crossings", "n_untracked_crossings",
    "crossings", "restored_link", "restored_verify_crossed", "restored_crossing_step", "restored_crossing_commit_len",
    "restored_crossing_tracked", "spec_verify_ct", "spec_accept_length", "completion_tokens",
    "finish_reason", "ttft", "itl", "e2e", "t_start", "retries", "error", "tokenizer", "injected_fault_hit",
]

_INT_COLUMNS = [
    "interval", "concurrency", "block_size", "turn", "input_len", "output_len", "ref_output_len",
    "drift_onset", "drift_onset_pos", "drift_onset_offset", "drift_compared",
    "first_divergence", "divergence_pos", "divergence_offset", "cand_rank", "cand_token", "ref_token",
    "cached_tokens", "restored_offset", "prompt_offset", "n_crossings", "n_untracked_crossings",
    "restored_crossing_step", "restored_crossing_commit_len", "spec_verify_ct", "completion_tokens",
    "retries",
]
LINK_COLUMNS = ["restored_link", "restored_verify_crossed", "restored_crossing_step", "restored_crossing_commit_len",
                "restored_crossing_tracked"]  # set by reports/links.py
_NOT_TEXT = set(LINK_COLUMNS)  # object columns that are never made text (frames_joined sets them)
_FLOAT_COLUMNS = ["drift", "drift_before_flip", "ref_margin", "spec_accept_length", "ttft", "itl", "e2e", "t_start"]
_BOOL_COLUMNS = {"restored": bool, "restored_verify_crossed": bool, "restored_crossing_tracked": "boolean",
                 "injected_fault_hit": "boolean"}
_TYPED = {*_INT_COLUMNS, *_FLOAT_COLUMNS, *_BOOL_COLUMNS}


@dataclass(frozen=True)
class Crossing:
    """One checkpoint boundary crossed while generating.

    `step` is the verify-block step whose state belongs at the boundary
    (`boundary - pre_len - 1`), i.e. the step that should have been tracked.
    Inferred crossings (engine without `spec_trace`) know only the boundary.
    """

    boundary: int
    source: str  # "reported" (from spec_trace) or "inferred" (from positions)
    pre_len: int | None = None
    commit_len: int | None = None
    step: int | None = None
    tracked: int | None = None  # the step the engine reports it tracked (-1: none)
    tracked_agrees: bool | None = None


def verify_crossings(spec_trace: Iterable[Sequence[int]], interval: int) -> list[Crossing]:
    """Boundaries crossed inside verify steps `[pre_len, commit_len, tracked_step]` (DESIGN.md 1)."""
    out = []
    for entry in spec_trace:
        pre, commit = int(entry[0]), int(entry[1])
        tracked = int(entry[2]) if len(entry) > 2 and entry[2] is not None else None
        boundary = crossed_boundary(pre, pre + commit, interval)  # with commit_len <= I one boundary at most
        if boundary is None:
            continue
        step = boundary_step(pre, boundary)
        out.append(Crossing(boundary, "reported", pre, commit, step, tracked, tracked == step))
    return out


def inferred_crossings(input_len: int, output_len: int, interval: int) -> list[Crossing]:
    """Boundaries b with input_len < b <= input_len + output_len (positions only; commit length unknown)."""
    return [Crossing(b, "inferred") for b in boundaries_between(input_len, input_len + output_len, interval)]


def record_interval(rec: dict) -> int | None:
    """The candidate pool's track interval: the record's own field, else its engine settings."""
    interval = rec.get("interval")
    if interval is None:
        interval = (rec.get("engine") or {}).get("interval")
    return int(interval) if interval else None


def pool_variant(engine: dict) -> str:
    """`full` (speculation + radix cache), `spec_only` or `cache_only` (the --diagnose pools), or `cold`."""
    spec, radix = engine.get("speculative"), engine.get("radix_cache")
    spec, radix = spec is not False, radix is not False  # a record without the flags is a full candidate
    return {(True, True): "full", (True, False): "spec_only", (False, True): "cache_only"}.get((spec, radix), "cold")


def onset_points_at(onset: int | None, restored: bool) -> str | None:
    """Where the first flagged output position points: a wrong state from the start is the restored
    checkpoint (or, without a restore, the prefill); a later onset is something during decoding."""
    if onset is None:
        return None
    if onset == 0:
        return "restored_checkpoint" if restored else "prefill"
    return "decode"


def _offset(pos: int | None, interval: int | None) -> int | None:
    return nearest_boundary_offset(pos, interval) if pos is not None and interval else None


def _row(cand: dict, ref: dict | None, threshold: float, tolerance: float, envelope: Envelope | None = None
         ) -> dict:
    interval = record_interval(cand)
    c = classify(cand, ref, threshold, tolerance, envelope)
    input_len = int(cand.get("input_len") or len(cand.get("input_ids") or []))
    output_len = len(cand.get("output_ids") or [])
    trace = cand.get("spec_trace")
    if interval is None:
        crossings, source = [], "none"
    elif trace is not None:
        crossings, source = verify_crossings(trace, interval), "reported"
    else:
        crossings, source = inferred_crossings(input_len, output_len, interval), "inferred"
    ref_len = len(ref.get("output_ids") or []) if ref is not None else None
    return row_of(cand, c, interval, input_len, output_len, ref_len, [crossing_dict(x) for x in crossings], source)


def row_of(cand: dict, c: Classification, interval: int | None, input_len: int, output_len: int,
           ref_output_len: int | None, crossings: list[dict], source: str) -> dict:
    """The requests-frame row of a candidate (its scalar fields in `cand`), given what its token lists gave:
    its classification, lengths and crossings (as crossing_dict gives them; `source`: reported, inferred or
    none)."""
    engine = cand.get("engine") or {}
    cached = int(cand.get("cached_tokens") or 0)
    div_pos = input_len + c.first_divergence if c.first_divergence is not None else None
    onset_pos = input_len + c.drift.onset if c.drift.onset is not None else None
    first_flag = c.drift.onset if c.drift.onset is not None else c.first_divergence
    return {
        "key": cand.get("key"), "run_id": cand.get("run_id"), "pool": cand.get("pool"),
        "variant": pool_variant(engine), "interval": interval, "concurrency": cand.get("concurrency"),
        "block_size": engine.get("block_size"), "fault": engine.get("fault"),
        "replica_id": cand.get("replica_id"), "suite": cand.get("suite"),
        "group": (cand.get("case") or {}).get("group"), "case_id": cand.get("case_id"),
        "session_id": cand.get("session_id"), "turn": cand.get("turn"), "input_hash": cand.get("input_hash"),
        "input_len": input_len, "output_len": output_len, "ref_output_len": ref_output_len,
        "class": c.cls, "detail": c.detail, "oracle": c.oracle if c.cls != "error" else None,
        "drift": c.drift.value, "drift_before_flip": c.drift.before, "drift_onset": c.drift.onset,
        "drift_onset_pos": onset_pos, "drift_onset_offset": _offset(onset_pos, interval),
        "drift_compared": c.drift.compared,
        "onset_points_at": onset_points_at(first_flag, cached > 0) if c.cls not in ("exact", "error") else None,
        "first_divergence": c.first_divergence, "divergence_pos": div_pos,
        "divergence_offset": _offset(div_pos, interval),
        "ref_margin": c.ref_margin, "cand_rank": c.cand_rank, "cand_token": c.cand_token,
        "ref_token": c.ref_token, "cached_tokens": cached, "restored": cached > 0,
        "restored_offset": input_len - cached if cached > 0 else None,
        "prompt_offset": _offset(input_len, interval),
        "crossing_source": source, "crossed_boundaries": " ".join(str(x["boundary"]) for x in crossings),
        "n_crossings": len(crossings),
        "n_untracked_crossings": sum(1 for x in crossings if x["tracked_agrees"] is False),
        "crossings": crossings_json(crossings),
        "restored_link": None, "restored_verify_crossed": False, "restored_crossing_step": None,
        "restored_crossing_commit_len": None, "restored_crossing_tracked": None,
        "spec_verify_ct": cand.get("spec_verify_ct"), "spec_accept_length": cand.get("spec_accept_length"),
        "completion_tokens": cand.get("completion_tokens", output_len),
        **{k: cand.get(k) for k in ("finish_reason", "ttft", "itl", "e2e", "t_start", "retries", "error", "tokenizer")},
        # the fault reached the turn or its restore-window probe (True wins; None: the engine does not say)
        "injected_fault_hit": (hit := cand.get("injected_fault_hit")) or cand.get("window_fault_hit") or hit,
    }


def crossing_dict(x: Crossing) -> dict:
    """`asdict(x)` without its deep copy (a Crossing holds only scalars)."""
    return {"boundary": x.boundary, "source": x.source, "pre_len": x.pre_len, "commit_len": x.commit_len,
            "step": x.step, "tracked": x.tracked, "tracked_agrees": x.tracked_agrees}


def empty_frame() -> pd.DataFrame:
    """A requests frame with every column and no rows."""
    return _typed(pd.DataFrame({c: [] for c in REQUEST_COLUMNS}))


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    """The frame's typed columns (those of REQUEST_COLUMNS it holds) converted in place."""
    for col in _INT_COLUMNS:
        if col in df:
            df[col] = pd.to_numeric(df[col], errors="coerce").astype("Float64").round().astype("Int64")
    for col in _FLOAT_COLUMNS:
        if col in df:
            df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
    for col, dtype in _BOOL_COLUMNS.items():
        if col in df:
            df[col] = df[col].astype(dtype)
    return df


def _text_kind(col: pd.Series) -> str:
    """`text` (its non-null values are all str), `none` (no values) or `other`."""
    values = col.dropna()
    if not len(values):
        return "none"
    return "text" if all(isinstance(v, str) for v in values) else "other"


def _is_text(col: pd.Series) -> bool:
    return col.dtype != object and pd.api.types.is_string_dtype(col.dtype)


def _chunk_kind(col: pd.Series) -> str:
    """_text_kind of a chunk's column, text where chunk_frame made it text."""
    if col.dtype == object:
        return _text_kind(col)
    if _is_text(col):
        return "text"
    return "other" if col.notna().any() else "none"


def chunk_frame(cols: dict[str, list]) -> pd.DataFrame:
    """Typed rows of REQUEST_COLUMNS lists, before any link is set (frames_joined puts them together); a column
    whose values are all text is text already (a chunk holds no str object per row and cell)."""
    df = _typed(pd.DataFrame(cols, columns=REQUEST_COLUMNS))
    for col in REQUEST_COLUMNS:
        if df[col].dtype == object and col not in _NOT_TEXT and _text_kind(df[col]) == "text":
            df[col] = df[col].astype("str")
    return df


def frames_joined(chunks: list[pd.DataFrame], links: dict[str, list]) -> pd.DataFrame:
    """The requests frame of chunk_frame chunks, in order, with the link columns (LINK_COLUMNS, whole lists):
    equal to frame() over the chunks' lists together (a text column is text wherever no chunk has other values
    and one has text). The chunks are consumed: each column leaves them as it is joined, and `chunks` is
    emptied."""
    if not chunks:
        return empty_frame()
    for col in REQUEST_COLUMNS:
        if col in _NOT_TEXT or col in _TYPED or all(_is_text(c[col]) for c in chunks):
            continue
        kinds = {_chunk_kind(c[col]) for c in chunks}
        if "other" in kinds:  # not text: its text chunks back to str objects, None where missing
            for c in chunks:
                if _is_text(c[col]):
                    c[col] = c[col].astype(object).where(c[col].notna(), None)
        elif "text" in kinds:
            for c in chunks:
                if not _is_text(c[col]):
                    c[col] = c[col].astype("str")
    typed = _typed(pd.DataFrame(links))
    joined = {}
    for col in REQUEST_COLUMNS:  # a column at a time, each chunk's copy freed once joined: never two frames at once
        if col in LINK_COLUMNS:
            joined[col] = typed[col].to_numpy() if typed[col].dtype == object else typed[col].array
        else:
            joined[col] = pd.concat([c[col] for c in chunks], ignore_index=True)
        for c in chunks:
            del c[col]
        release()  # the chunks' pieces are small blocks of the heap, the joined column is a new mapping
    chunks.clear()
    return pd.DataFrame(joined, columns=REQUEST_COLUMNS)


def pool_limits(per_pool: Mapping[str, tuple], pool, default: tuple[float, float]
                ) -> tuple[float, float, Envelope | None]:
    """A pool's (margin threshold, drift tolerance, envelope) from `per_pool` (2- or 3-tuples), else `default`."""
    limits = per_pool.get(str(pool), default)
    return limits[0], limits[1], (limits[2] if len(limits) > 2 else None)


def analyze(candidates: Iterable[dict], references: dict[str, dict], threshold: float = MARGIN_THRESHOLD,
            tolerance: float = DRIFT_TOLERANCE,
            per_pool: Mapping[str, tuple] | None = None) -> pd.DataFrame:
    """One row per candidate record (columns REQUEST_COLUMNS): class, drift, divergence, margin, attribution.

    `references` maps `input_hash` to the reference record; `threshold` is the soft margin, `tolerance`
    the log-prob drift allowed; `per_pool` maps a pool name to its own (threshold, tolerance) or (threshold,
    tolerance, envelope) (reports/envelope.py), for pools calibrated on their own path (harness/calibrate.py),
    the others take `threshold` and `tolerance`.
    """
    per_pool = per_pool or {}
    rows, seqs = [], []
    for cand in candidates:
        t, tol, env = pool_limits(per_pool, cand.get("pool"), (threshold, tolerance))
        rows.append(_row(cand, references.get(str(cand.get("input_hash"))), t, tol, env))
        seqs.append((cand.get("input_ids"), cand.get("output_ids")))
    cols = {c: [r[c] for r in rows] for c in REQUEST_COLUMNS}
    return frame(cols, seqs_on_path(seqs))


def frame(cols: dict[str, list], on_path: OnPath) -> pd.DataFrame:
    """The typed requests frame of REQUEST_COLUMNS lists, with restored checkpoints linked (one per row)."""
    if not cols["key"]:
        return empty_frame()
    link_restored_checkpoints(cols, on_path)
    return _typed(pd.DataFrame(cols, columns=REQUEST_COLUMNS))
