"""What the verdict takes from a run's token lists besides the requests frame, one small value per candidate.

The gate's checks past the oracle read two things from the records' token lists: the drift of a restored turn's
first output token (reports/controls.py, restore onsets) and the draft tokens a pool accepted (reports/
exercised.py, from `spec_trace`); a calibration (harness/calibrate.py) also reads its controls' drift summed over
their first outputs (reports/envelope.py, `ladder_sums`). `TokenFacts` holds those per candidate key, so that a
report can be judged and a run calibrated without holding any record: the streamed analyzer (reports/
analyze_run.py) fills it batch by batch, and `TokenFacts.of(records, references)` gives the same values from
record dicts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from reports.envelope import ladder_sums
from reports.oracle import compared_drifts
from reports.window import WindowFact, window_fact


def first_token_drift(cand: dict, ref: dict | None) -> float | None:
    """|candidate - reference| log-prob of the first output token, where both chose the same token (None else).
    A restored turn's first token comes from the prefill after its checkpoint: with a wrong state it moves from
    there, while the path numerics of a split prefill move it very little (bf16: <= 0.006 on the trained model,
    where whole turns drift by 0.17 through verify numerics)."""
    if ref is None:
        return None
    c, r = cand.get("output_logprobs") or [], ref.get("output_logprobs") or []
    ids_c, ids_r = cand.get("output_ids") or [], ref.get("output_ids") or []
    if not c or not r or not ids_c or not ids_r or ids_c[0] != ids_r[0] or c[0] is None or r[0] is None:
        return None
    return abs(float(c[0]) - float(r[0]))


def accepted_tokens(trace: Iterable | None) -> int | None:
    """Draft tokens a request's verify steps accepted (each step's commit length past its bonus token); None
    without a `spec_trace`."""
    if trace is None:
        return None
    return sum(max(0, int(e[1]) - 1) for e in trace) if trace else 0


@dataclass
class TokenFacts:
    """Per candidate key: its first output token's drift (where first_token_drift has one) and the draft tokens
    it accepted (None: no spec_trace)."""

    first_drift: dict[str, float] = field(default_factory=dict)
    accepted: dict[str, int | None] = field(default_factory=dict)
    # of the pools asked for (`ladder_pools`), each answered candidate with an answered reference: the ladder
    # sums of the drifts the oracle compares (reports.envelope.ladder_sums of reports.oracle.compared_drifts)
    ladders: dict[str, tuple[float, ...]] = field(default_factory=dict)
    # each probed restored turn: its compared restore window, or why it was not compared (reports/window.py)
    window: dict[str, WindowFact | str] = field(default_factory=dict)

    def add_window(self, key: str, rec: Mapping) -> None:
        """The restore window of `rec` (a candidate record, or its `_extra` fields), if it was probed."""
        fact = window_fact(rec)
        if fact is not None:
            self.window[key] = fact

    def add_ladder(self, key: str, cand: dict, ref: dict | None) -> None:
        """The ladder sums of `cand` (a record of an asked-for pool) against `ref`, if both answered."""
        if not cand.get("error") and ref is not None and not ref.get("error"):
            self.ladders[key] = ladder_sums(compared_drifts(cand, ref))

    @classmethod
    def of(cls, records: Mapping[str, dict], references: Mapping[str, dict] | None = None,
           ladder_pools: Callable[[str], bool] | None = None) -> TokenFacts:
        """The facts of candidate records (key -> record) and their references (input_hash -> record);
        `ladder_pools(pool)`: whether a record's ladder sums are wanted (None: no one's)."""
        references = references or {}
        facts = cls()
        for key, rec in records.items():
            ref = references.get(str(rec.get("input_hash")))
            d = first_token_drift(rec, ref)
            if d is not None:
                facts.first_drift[key] = d
            facts.accepted[key] = accepted_tokens(rec.get("spec_trace"))
            facts.add_window(key, rec)
            if ladder_pools is not None and ladder_pools(str(rec.get("pool"))):
                facts.add_ladder(key, rec, ref)
        return facts
