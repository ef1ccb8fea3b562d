"""What the driver keeps of requests already recorded: keys, hashes and a digest of output ids, not records.

The summaries themselves (`RefDone`, `Recorded`) and the resume state read from a run directory
(`ResumeState.read(run_dir)`) are records/resume.py's: records/ is the one reader of stored records. Here is
what the driver adds to them: `continued` (the recorded turns a resumed session builds its next turn on) and
`records_io` (ids of recorded turns given whole, for callers that hold the records).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from records.resume import Recorded, RefDone, ResumeState
from records.schema import point_key

__all__ = ["Recorded", "RefDone", "ResumeState", "as_recorded", "as_ref_done", "continued", "records_io"]


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
