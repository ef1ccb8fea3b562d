"""What a resume reads of a run directory: every recorded key and a summary of each recorded request, not records.

A reference is served once per distinct input for the whole run; later candidates with that input only need
to know that it is done, whether it failed and whether their output differs from it (the live mismatch
count). `RefDone` is that, a few dozen bytes where a record with its outputs and top-k is tens of kilobytes.
`ResumeState.read(run_dir)` is what `--resume` needs, read from the columns of just these fields: every
recorded key, each recorded candidate as a `Recorded` (turn, input hash, failed, output digest), each
recorded reference as a `RefDone`; `io(keys)` fetches the input and output ids of just the turns whose next
turn is still to be sent (the driver builds that turn from them). `written_point_keys(run_dir)` names the
sweep-point and warmup records already written, which a resume must not write again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from records import layout as L
from records.columns import overrides, rows_as_records, stored_columns
from records.reader import RunReader
from records.schema import POINTS_FILE, WARMUP_FILE


def output_digest(output_ids) -> bytes:
    """16 bytes that are equal for equal output id lists (None counts as empty)."""
    arr = np.asarray(list(output_ids or []), dtype=np.int64)
    return hashlib.blake2b(arr.tobytes(), digest_size=16).digest()


@dataclass(frozen=True)
class RefDone:
    """A written reference, as later candidates of its input need it."""

    failed: bool
    output: bytes  # output_digest of its output ids

    @classmethod
    def of(cls, record: dict, output: bytes | None = None) -> RefDone:
        """The summary of a reference record (`output`: its output digest, when already computed)."""
        return cls(record.get("error") is not None, output or output_digest(record.get("output_ids")))


@dataclass(frozen=True)
class Recorded:
    """A recorded candidate turn, as a resumed driver needs it."""

    key: str
    turn: int | None
    input_hash: str | None
    failed: bool  # its record has an error: the session's later turns are not sent
    output: bytes  # output_digest of its output ids
    pool: str | None = None
    session_id: str | None = None
    max_new_tokens: int | None = None  # with io(), what re-sending its missing reference takes

    @classmethod
    def of(cls, record: dict, output: bytes | None = None) -> Recorded:
        """The summary of a candidate record (`output`: its output digest, when already computed)."""
        turn = record.get("turn")
        return cls(record["key"], turn if isinstance(turn, int) else None, record.get("input_hash"),
                   record.get("error") is not None, output or output_digest(record.get("output_ids")),
                   record.get("pool"), record.get("session_id"), record.get("max_new_tokens"))

    def differs(self, ref: RefDone) -> bool:
        """The live mismatch test on summaries: both answered and the output ids differ (the analyzer classifies
        later). A fresh candidate is compared as `Recorded.of(record)`."""
        return not self.failed and not ref.failed and self.output != ref.output


# the scalar fields a summary reads; the output ids are digested from their column apart (_summaries)
_FIELDS = ["key", "role", "pool", "session_id", "turn", "input_hash", "max_new_tokens", "error"]


@dataclass(frozen=True)
class ResumeState:
    """What a run directory holds, as the driver resumes it (see module doc)."""

    run_dir: Path
    keys: frozenset[str]  # every recorded key: candidates, references, stats, sweep points, warmups
    candidates: dict[str, Recorded]  # candidate key -> summary (the first record per key, as load_run keeps)
    references: dict[str, RefDone]  # input hash -> the first reference record's summary

    @classmethod
    def read(cls, run_dir: str | Path) -> ResumeState:
        """Read keys, roles, turns, hashes, errors and output ids (digested a batch at a time) of `run_dir`."""
        reader = RunReader(run_dir)
        seen: set = set()
        candidates: dict[str, Recorded] = {}
        references: dict[str, RefDone] = {}
        for stem in reader.stems():
            if not L.is_request_stem(stem):
                for _ in reader.batches(stem, ["key"], seen):  # stats and the like: only their keys count
                    pass
                continue
            for batch in reader.batches(stem, stored_columns([*_FIELDS, "output_ids"]), seen):
                for rec, out in _summaries(batch):
                    if rec.get("role") == "candidate" and isinstance(rec.get("key"), str):
                        candidates.setdefault(rec["key"], Recorded.of(rec, out))
                    elif rec.get("role") == "reference":
                        references.setdefault(str(rec.get("input_hash")), RefDone.of(rec, out))
        return cls(Path(run_dir), frozenset(k for k in seen if isinstance(k, str)), candidates, references)

    def unanswered(self) -> list[Recorded]:
        """Answered candidates whose input has no reference record: an earlier process stopped before it came."""
        return [c for c in self.candidates.values() if not c.failed and str(c.input_hash) not in self.references]

    def io(self, keys: Iterable[str]) -> dict[str, tuple[list[int] | None, list[int] | None]]:
        """(input ids, output ids) of these recorded candidate turns, reading only the row groups that hold them."""
        keys = [k for k in keys if k in self.candidates]
        return RunReader(self.run_dir).turn_io(keys) if keys else {}


def _summaries(batch: pa.RecordBatch) -> Iterator[tuple[dict, bytes]]:
    """Each row's _FIELDS as its record has them and the digest of its output ids, from the flat column (no id
    becomes a Python int) unless the record keeps them verbatim."""
    over = overrides(batch)
    ids = batch.column("output_ids")
    offsets = ids.offsets.to_numpy()
    flat = ids.values.to_numpy(zero_copy_only=False).astype(np.int64)
    valid = ids.is_valid().to_numpy(zero_copy_only=False)
    for i, rec in enumerate(rows_as_records(batch, _FIELDS, over)):
        if "output_ids" in over[i].values:
            out = output_digest(over[i].values["output_ids"])
        else:
            part = flat[offsets[i]:offsets[i + 1]] if valid[i] else flat[:0]
            out = hashlib.blake2b(part.tobytes(), digest_size=16).digest()
        yield rec, out


def written_point_keys(run_dir: str | Path) -> set[str]:
    """The keys of the sweep-point and warmup records already in `run_dir` (what a resume must not write again)."""
    reader = RunReader(run_dir)
    stems = {Path(POINTS_FILE).stem, Path(WARMUP_FILE).stem} & set(reader.stems())
    return {str(rec.get("key")) for stem in sorted(stems) for rec in reader.records(stem)}
