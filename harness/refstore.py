"""What the driver keeps of requests already recorded: keys, hashes and a digest of output ids, not records.

A reference is served once per distinct input for the whole run; later candidates with that input only need
to know that it is done, whether it failed and whether their output differs from it (the live mismatch
count). `RefDone` is that, a few dozen bytes where a record with its outputs and top-k is tens of kilobytes.
`ResumeState.read(run_dir)` is what `--resume` needs, read through records/reader.py's columns: every
recorded key, each recorded candidate as a `Recorded` (turn, input hash, failed, output digest), each
recorded reference as a `RefDone`; `io(keys)` fetches the input and output ids of just the turns whose next
turn is still to be sent (the driver builds that turn from them).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from records import layout as L
from records.reader import RunReader
from records.schema import point_key


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


def as_recorded(rec: dict | Recorded) -> Recorded:
    return rec if isinstance(rec, Recorded) else Recorded.of(rec)


def as_ref_done(rec: dict | RefDone) -> RefDone:
    return rec if isinstance(rec, RefDone) else RefDone.of(rec)


def records_io(records: Mapping[str, dict | Recorded]) -> Callable[[Iterable[str]], dict]:
    """ResumeState.io for candidate records given whole (a caller that has them: tests, benchmarks)."""
    def io(keys: Iterable[str]) -> dict[str, tuple[list[int] | None, list[int] | None]]:
        return {k: (records[k].get("input_ids"), records[k].get("output_ids")) for k in keys
                if isinstance(records.get(k), dict)}
    return io


def continued(existing: Mapping[str, Recorded], sessions: Mapping[str, tuple], labels: list[str]) -> set[str]:
    """Recorded turns whose next turn is not recorded: a resumed session builds that turn from their ids."""
    out: set[str] = set()
    if not existing:
        return out
    for name, group in sessions.items():
        for label in labels:
            for s in group:
                keys = [point_key(name, label, s.session_id, n) for n in range(len(s.turns))]
                out.update(k for k, nxt in zip(keys, keys[1:], strict=False) if k in existing and nxt not in existing)
    return out


_COLUMNS = ["key", "role", "pool", "session_id", "turn", "input_hash", "max_new_tokens", "error", "output_ids",
            "_extra", "_absent"]


@dataclass(frozen=True)
class ResumeState:
    """What a run directory holds, as the driver resumes it (see module doc)."""

    run_dir: Path
    keys: frozenset[str]  # every recorded key: candidates, references, stats
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
                for _ in reader.batches(stem, ["key"], seen):  # stats: only their keys count
                    pass
                continue
            for batch in reader.batches(stem, _COLUMNS, seen):
                for rec, out in _records(batch):
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


def _records(batch) -> Iterable[tuple[dict, bytes]]:
    """Each row of a batch of _COLUMNS as its record's scalar fields (`_extra` put back, absent fields left
    out) and the digest of its output ids (from the flat column: no id becomes a Python int)."""
    data = batch.select([c for c in _COLUMNS if c != "output_ids"]).to_pydict()
    ids = batch.column("output_ids")
    offsets = ids.offsets.to_numpy()
    flat = ids.values.to_numpy(zero_copy_only=False).astype(np.int64)
    valid = ids.is_valid().to_numpy(zero_copy_only=False)
    for i in range(batch.num_rows):
        extra = json.loads(data["_extra"][i]) if data["_extra"][i] is not None else {}
        absent = set(data["_absent"][i] or ())
        rec = {c: data[c][i] for c in _COLUMNS if c in data and not c.startswith("_") and c not in absent}
        rec.update({k: v for k, v in extra.items() if k in _COLUMNS})
        if "output_ids" in extra:
            out = output_digest(extra["output_ids"])
        else:
            part = flat[offsets[i]:offsets[i + 1]] if valid[i] else flat[:0]
            out = hashlib.blake2b(part.tobytes(), digest_size=16).digest()
        yield rec, out
