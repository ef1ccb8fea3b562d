"""What earlier processes of a run recorded, as the driver goes on from it (a `--resume`).

The driver keeps summaries, not records (records/resume.py: a `Recorded` per candidate turn, a `RefDone` per
reference): a recorded turn is not sent again, a session continued past it builds its next turn on its ids
(read back for just those turns), an answered candidate whose reference an earlier process did not record gets
its reference now, and a sweep point's or warmup request's record already written is not written again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from records.resume import Recorded, RefDone, written_point_keys
from records.schema import point_key

TurnIO = Callable[[Iterable[str]], dict]  # keys -> {key: (input ids, output ids)} of those recorded turns


def records_io(records: Mapping[str, dict | Recorded]) -> TurnIO:
    """The TurnIO of candidate records given whole (a caller that has them: tests, benchmarks)."""
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


class RunSoFar:
    """The run's records so far, by key (module doc). `candidates` and `references` may be given as records or
    as their summaries; `turn_io` reads back the ids of recorded turns (default: from the records given)."""

    def __init__(self, candidates: Mapping[str, dict | Recorded] | None = None,
                 references: Mapping[str, dict | RefDone] | None = None, turn_io: TurnIO | None = None) -> None:
        self.candidates = {k: r if isinstance(r, Recorded) else Recorded.of(r) for k, r in (candidates or {}).items()}
        self.references = {h: r if isinstance(r, RefDone) else RefDone.of(r) for h, r in (references or {}).items()}
        self.turn_io = turn_io or records_io(candidates or {})
        self.io: dict[str, tuple] = {}  # key -> (input ids, output ids) of the recorded turns `load` read back
        self.points: set[str] = set()  # keys of the sweep-point and warmup records written

    def load(self, run_dir: Path, sessions: dict[str, tuple], labels: list[str]) -> list[tuple[Recorded, object]]:
        """Read what going on needs: the point and warmup keys of `run_dir`, and the ids of the recorded turns
        that a session continues from or whose reference is missing. Returns those recorded candidates, with
        their sessions, whose reference an earlier process did not record (it stopped before it came)."""
        self.points = written_point_keys(run_dir)
        by_id = {(name, s.session_id): s for name, group in sessions.items() for s in group}
        owed = [r for r in self.candidates.values() if not r.failed and (r.pool, r.session_id) in by_id
                and str(r.input_hash) not in self.references]
        need = {r.key for r in owed} | continued(self.candidates, sessions, labels)
        self.io = self.turn_io(need) if need else {}
        return [(r, by_id[(r.pool, r.session_id)]) for r in owed]

    def mismatches(self) -> int:
        """Recorded candidates whose recorded reference differs (the live mismatch count they left)."""
        return sum(1 for rec in self.candidates.values()
                   if (ref := self.references.get(str(rec.input_hash))) is not None and rec.differs(ref))

    def todo(self, pool: str, label: str, sessions: tuple) -> list[tuple[int, object]]:
        """(index, session) of the sessions with a turn left at sweep point `label` of `pool`."""
        return [(i, s) for i, s in enumerate(sessions)
                if any(point_key(pool, label, s.session_id, n) not in self.candidates for n in range(len(s.turns)))]

    def left(self, pool: str, label: str, todo: list[tuple[int, object]]) -> int:
        """The turns of `todo`'s sessions not recorded yet (what this process plans to send)."""
        return sum(point_key(pool, label, s.session_id, n) not in self.candidates
                   for _, s in todo for n in range(len(s.turns)))

    def started(self, pool: str, label: str) -> bool:
        """Whether an earlier process recorded a turn of this sweep point (and so sent its warmup)."""
        return any(k.startswith(f"{pool}-{label}/") for k in self.candidates)

    def written(self, key: str) -> bool:
        """Whether the sweep-point or warmup record `key` is written already."""
        return key in self.points
