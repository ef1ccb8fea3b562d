"""The paired check: each restored turn against the same request on a trusted build (`--baseline-run RUN_DIR`).

A noisy target moves log-probs through numerics alone, so a restore that leaves a
slightly wrong state (a checkpoint one token off, a conv window not copied) can move a
turn by no more than bf16 moves a clean one: no limit from controls tells them apart
(docs/reports.md, the bf16 per-fault table). A release gate has a better yardstick: the
same request (same key: pool, sweep point, session, turn; same input) served by the
same configuration on the build that shipped. Where the engine is deterministic for a
given batch (the built-in engine at concurrency 1, in fp32 and bf16 alike), an unchanged
path gives the trusted turn's log-probs bit for bit, and any change the new build made
to a restored state shows, however small.

Per matched pair the pair drift at each output of their common tokens is |log-prob -
trusted log-prob|. A sweep point is paired only where the engine served it
deterministically: every matched turn of it that restored nothing (the bug class cannot
act on them) equals its twin bit for bit. There a restored turn whose pair drift summed over
its first n outputs passes DRIFT_FLOOR x n (reports/envelope.py), or whose tokens part from
its twin's, moved from the trusted run: drift, unless the trusted run itself flagged that
turn (a turn that was wrong may change: a fix). Where batching moved the unrestored turns
(the built-in engine at concurrency 4 and up: by up to 0.03 per output in bf16), it moves
the restored ones more (their checkpoint was itself taken in a batch: measured, clean
restored turns passed 3x the unrestored turns' summed pair drift at their first output), so
such a sweep point is not paired and the controls' limits alone judge it; the report says
which. A build that changed numerics everywhere is not paired for the same reason. So a
trusted run must be trusted: a change the new build makes on the restore path, a fix of a
restore bug the trusted run's own oracle missed included, is flagged; re-baseline after a
fix.

What is held: the trusted run's candidate output ids and log-probs of the gated pools
(int64 and float64 arrays: 16 bytes per output token), then one batch of the new run at a
time.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from records import layout as L
from records.reader import RunReader
from reports.envelope import DRIFT_FLOOR, LADDER, Envelope

_COLUMNS = ["key", "role", "pool", "input_hash", "cached_tokens", "output_ids", "output_logprobs", "error",
            "_extra", "_absent"]
DETAIL = "moved from the trusted run"


@dataclass
class Turn:
    """One answered candidate's output, as the paired check compares it."""

    pool: str
    input_hash: str
    restored: bool
    ids: np.ndarray
    logprobs: np.ndarray  # float64, NaN where the record has none


@dataclass
class Paired:
    """What the paired check found: per flagged key its detail, and the figures the report shows."""

    trusted_run: str
    matched: int = 0  # candidates with a trusted twin (same key and input)
    judged: int = 0  # matched restored turns of paired sweep points
    flagged: dict[str, str] = field(default_factory=dict)
    paired_points: list[str] = field(default_factory=list)  # sweep points served deterministically: paired
    # the others: their unrestored turns' largest move (inf: their tokens part from their twins')
    moved_points: dict[str, float] = field(default_factory=dict)
    skipped_trusted_flagged: int = 0  # restored turns the trusted run flagged itself: not judged here

    def text(self) -> str:
        """One sentence for the report."""
        if not self.matched:
            return f"no request of this run has a twin in the trusted run {self.trusted_run} (same key and input)"
        moved = "; ".join(f"{p} ({_how_far(v)})" for p, v in sorted(self.moved_points.items()))
        return (f"paired with the trusted run {self.trusted_run}: {self.matched} request(s) matched (same key and "
                f"input); {len(self.paired_points)} sweep point(s) served deterministically (every turn that "
                f"restored nothing equal to its twin bit for bit): {self.judged} restored turn(s) judged against "
                f"their twins, {len(self.flagged)} moved (more than {DRIFT_FLOOR:g} per output, or other tokens)"
                + (f"; not paired, their unrestored turns moved: {moved}" if moved else "")
                + (f"; {self.skipped_trusted_flagged} restored turn(s) the trusted run flagged itself, not paired"
                   if self.skipped_trusted_flagged else ""))


def _how_far(move: float) -> str:
    return "their tokens part from their twins'" if move == float("inf") else f"by up to {move:.3g} per output"


def _turns(run_dir: Path, pools: set[str] | None) -> Iterator[tuple[str, Turn]]:
    """(key, Turn) of every answered candidate of `pools` (None: every pool) in `run_dir`, first record per key."""
    reader = RunReader(run_dir)
    seen: set = set()
    for stem in reader.stems():
        if not L.is_request_stem(stem):
            continue
        for batch in reader.batches(stem, _COLUMNS, seen):
            data = batch.to_pydict()
            for i, role in enumerate(data["role"]):
                pool = data["pool"][i]
                if role != "candidate" or (pools is not None and pool not in pools) or data["error"][i]:
                    continue
                extra = json.loads(data["_extra"][i]) if data["_extra"][i] else {}
                ids = extra.get("output_ids", data["output_ids"][i]) or []
                lps = extra.get("output_logprobs", data["output_logprobs"][i]) or []
                lp = np.array([np.nan if v is None else float(v) for v in lps], dtype=np.float64)
                yield str(data["key"][i]), Turn(str(pool), str(data["input_hash"][i]),
                                                int(data["cached_tokens"][i] or 0) > 0,
                                                np.asarray(ids, dtype=np.int64), lp)


def _flagged_keys(run_dir: Path) -> set[str]:
    """Keys the trusted run's own report flagged (its requests.csv: drift or hard); empty without one."""
    try:
        with open(run_dir / "requests.csv", newline="") as f:
            return {r["key"] for r in csv.DictReader(f) if r.get("class") in ("drift", "hard")}
    except OSError:
        return set()


def pair_drifts(new: Turn, trusted: Turn) -> tuple[list[float], int | None]:
    """Per output of the two turns' common tokens, |log-prob - trusted log-prob| (0 where either has none), and
    where their tokens part (None: one is a prefix of the other)."""
    n = min(len(new.ids), len(trusted.ids))
    differ = np.flatnonzero(new.ids[:n] != trusted.ids[:n])
    part = int(differ[0]) if len(differ) else None
    upto = n if part is None else part
    m = min(upto, len(new.logprobs), len(trusted.logprobs))
    d = np.abs(new.logprobs[:m] - trusted.logprobs[:m])
    return np.nan_to_num(d, nan=0.0).tolist(), part


def sweep_group(key: str, pool: str) -> str:
    """A key's pool and sweep point (`i128-c4/session/turn` -> `i128-c4`), the group its pair noise comes from."""
    return key.split("/", 1)[0] if "/" in key else pool


def paired_check(run_dir: str | Path, trusted_run: str | Path, pools: set[str]) -> Paired:
    """The paired check of `run_dir`'s candidates of `pools` (the gated ones) against `trusted_run`'s."""
    run_dir, trusted_dir = Path(run_dir), Path(trusted_run)
    trusted = dict(_turns(trusted_dir, pools))
    own_flags = _flagged_keys(trusted_dir)
    out = Paired(str(trusted_run))
    moved: dict[str, float] = {}  # sweep point -> the largest pair drift of its unrestored turns (inf: tokens part)
    restored: list[tuple[str, str, list[float], int | None]] = []
    for key, turn in _turns(run_dir, pools):
        twin = trusted.get(key)
        if twin is None or twin.input_hash != turn.input_hash:
            continue
        out.matched += 1
        diffs, part = pair_drifts(turn, twin)
        group = sweep_group(key, turn.pool)
        if not turn.restored:
            worst = max(diffs, default=0.0) if part is None else float("inf")
            moved[group] = max(moved.get(group, 0.0), worst)
        elif key in own_flags:
            out.skipped_trusted_flagged += 1
        else:
            restored.append((key, group, diffs, part))
    out.paired_points = sorted(g for g, v in moved.items() if v == 0.0)
    out.moved_points = {g: v for g, v in moved.items() if v > 0.0}
    exact = Envelope(tuple(DRIFT_FLOOR * n for n in LADDER))
    for key, group, diffs, part in restored:
        if group not in out.paired_points:
            continue
        out.judged += 1
        passed = exact.onset(diffs)
        if passed is not None:
            i, total, limit = passed
            out.flagged[key] = (f"{DETAIL}: pair drift summed over outputs 0-{i} {total:.3g} > {limit:.3g} there "
                                "(its sweep point's turns that restored nothing equal their twins bit for bit)")
        elif part is not None:
            out.flagged[key] = (f"{DETAIL}: its tokens leave the trusted turn's at output {part} (its sweep point's "
                                "turns that restored nothing equal their twins bit for bit)")
    return out
