"""The oracle: how one candidate output compares with its cold-path reference (DESIGN.md 3.3).

Token equality alone is a weak oracle (a corrupted linear state often still emits
the same tokens), so the log-probs are compared too, over the common prefix:

* `exact`: same tokens, log-prob drift within the tolerance;
* `drift`: same tokens, drift beyond the tolerance (or, in a calibrated pool, drift summed over the first
  outputs beyond the path's envelope, reports/envelope.py): a silent state divergence;
* `soft`: tokens differ, the reference's top-1/top-2 margin at the first divergence is
  strictly below the threshold and there was no drift before it (nor at it, among the
  top-k entries both sides returned there): a numerics flip;
* `hard`: tokens differ otherwise (a margin at or above the threshold, drift before or
  at the flip, top-k lists at the flip that share no token, a missing top-2, one
  output a strict prefix of the other);
* `error`: the request, or its reference, failed or is missing.

Without log-probs on both sides the drift cannot be measured: the margin rule alone
decides (`oracle` = "margin") and the detail says so. Pure functions over records.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from reports.envelope import Envelope

CLASSES = ("exact", "drift", "soft", "hard", "error")
FLAGGED = ("drift", "hard")  # the classes that signal a state bug
MARGIN_THRESHOLD = 0.5  # reference top-1/top-2 log-prob margin below which a flip is soft
DRIFT_TOLERANCE = 1e-3  # log-prob drift above which equal tokens are a silent divergence (built-in engine)


@dataclass(frozen=True)
class Drift:
    """Log-prob agreement of a candidate with its reference over their common prefix."""

    value: float | None  # max |candidate - reference| log-prob; None when not measurable
    onset: int | None  # first output index whose difference exceeds the tolerance (or passes the envelope)
    compared: int  # positions compared
    # (cumulative drift, its limit) where the running sum passed the pool's envelope (reports/envelope.py) before
    # any single position passed the tolerance; None otherwise
    envelope: tuple[float, float] | None = None
    # max |candidate - reference| before the first divergent token: what the path's numerics had moved before a
    # flip, never the flip's own top-k (reports/numerics.py); the whole `value` when the tokens are equal
    before: float | None = None

    @property
    def measured(self) -> bool:
        return self.value is not None


@dataclass(frozen=True)
class Classification:
    """The outcome of comparing one candidate output with its reference."""

    cls: str
    detail: str
    first_divergence: int | None = None
    ref_margin: float | None = None
    cand_rank: int | None = None
    cand_token: int | None = None
    ref_token: int | None = None
    drift: Drift = Drift(None, None, 0)

    @property
    def oracle(self) -> str:
        """`logprob` when drift was measured, `margin` when only the margin rule could decide."""
        return "logprob" if self.drift.measured else "margin"


def first_divergence(cand: Sequence[int], ref: Sequence[int]) -> int | None:
    """First output index where the two token lists differ (shorter length if one is a prefix); None if equal."""
    for i, (a, b) in enumerate(zip(cand, ref, strict=False)):
        if a != b:
            return i
    return None if len(cand) == len(ref) else min(len(cand), len(ref))


def tie_flip(a: dict, b: dict, margin: float = DRIFT_TOLERANCE) -> bool:
    """Whether two records of one request (two runs of it, same engine) part at a near-tie: at their first
    differing output token, each side's top-k log-probs hold the other side's token within `margin` of its own
    choice. A request batched with other requests the second time can flip so on kernels that are not
    batch-invariant; equal outputs, or one a strict prefix of the other, are no flip."""
    x, y = list(a.get("output_ids") or []), list(b.get("output_ids") or [])
    p = first_divergence(x, y)
    if p is None or p >= min(len(x), len(y)):
        return False

    def within(rec: dict, mine: int, other: int) -> bool:
        top = {tok: lp for lp, tok in _sorted_top(_at(rec.get("output_top_logprobs"), p))}
        return mine in top and other in top and top[mine] - top[other] < margin

    return within(a, x[p], y[p]) and within(b, y[p], x[p])


def _number(x) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _sorted_top(top: Sequence | None) -> list[tuple[float, int]]:
    if not top:
        return []
    entries = [(float(e[0]), int(e[1])) for e in top if e is not None and e[0] is not None]
    return sorted(entries, key=lambda e: -e[0])


def top_margin(top: Sequence | None) -> float | None:
    """Top-1 minus top-2 log-prob of one position's top-k `[[logprob, token_id], ...]`; None if k < 2."""
    entries = _sorted_top(top)
    return entries[0][0] - entries[1][0] if len(entries) >= 2 else None


def token_rank(top: Sequence | None, token: int) -> int | None:
    """1-based rank of `token` in one position's top-k (1 = top-1); None if absent."""
    for rank, (_, tok) in enumerate(_sorted_top(top), start=1):
        if tok == token:
            return rank
    return None


def position_drift(cand_lp, ref_lp, cand_top: Sequence | None, ref_top: Sequence | None) -> float | None:
    """Largest |difference| at one position: the chosen token's log-prob and every top-k token both returned."""
    diffs = []
    a, b = _number(cand_lp), _number(ref_lp)
    if a is not None and b is not None:
        diffs.append(abs(a - b))
    ours = {tok: lp for lp, tok in _sorted_top(cand_top)}
    for lp, tok in _sorted_top(ref_top):
        if tok in ours:
            diffs.append(abs(ours[tok] - lp))
    return max(diffs) if diffs else None


def measured_drifts(cand: dict, ref: dict, upto: int, flip: int | None = None) -> list[tuple[int, float]] | None:
    """(output index, position_drift) of each position compared: [0, upto), then `flip` on its top-k entries;
    None when a side has no log-probs at all."""
    c_lp, r_lp = cand.get("output_logprobs") or [], ref.get("output_logprobs") or []
    c_top, r_top = cand.get("output_top_logprobs") or [], ref.get("output_top_logprobs") or []
    if not ((c_lp or c_top) and (r_lp or r_top)) and (upto > 0 or flip is not None):
        return None
    diffs = [(i, position_drift(_at(c_lp, i), _at(r_lp, i), _at(c_top, i), _at(r_top, i))) for i in range(upto)]
    if flip is not None:  # the tokens differ there: only the distribution they were drawn from can be compared
        diffs.append((flip, position_drift(None, None, _at(c_top, flip), _at(r_top, flip))))
    return [(i, d) for i, d in diffs if d is not None]


def compared_drifts(cand: dict, ref: dict) -> list[float]:
    """The per-position drifts classify compares for this pair, in order (what the envelope sums)."""
    c_out, r_out = list(cand.get("output_ids") or []), list(ref.get("output_ids") or [])
    p = first_divergence(c_out, r_out)
    flip = p if p is not None and p < min(len(c_out), len(r_out)) else None
    return [d for _, d in measured_drifts(cand, ref, len(c_out) if p is None else p, flip) or []]


def logprob_drift(cand: dict, ref: dict, upto: int, tolerance: float = DRIFT_TOLERANCE,
                  flip: int | None = None, envelope: Envelope | None = None) -> Drift:
    """Drift over output positions [0, upto), and at the `flip` position (the first divergent token) over the
    top-k entries both returned there; value None unless both records carry log-probs. The onset is the first
    position past `tolerance`, or where the running sum passes `envelope`, whichever comes first."""
    measured = measured_drifts(cand, ref, upto, flip)
    if measured is None:
        return Drift(None, None, 0)  # a side without log-probs (an engine that does not return them)
    onset = next((i for i, d in measured if d > tolerance), None)
    value = max((d for _, d in measured), default=0.0)
    before = max((d for i, d in measured if i < upto), default=0.0)
    passed = envelope.onset([d for _, d in measured]) if envelope is not None else None
    if passed is not None and (onset is None or measured[passed[0]][0] < onset):
        return Drift(value, measured[passed[0]][0], len(measured), (passed[1], passed[2]), before)
    return Drift(value, onset, len(measured), before=before)


def _at(seq: Sequence | None, i: int):
    return seq[i] if seq is not None and 0 <= i < len(seq) else None


def _disjoint(cand_top: Sequence | None, ref_top: Sequence | None) -> bool:
    """True when both sides returned a top-2 or more at a position and no token is in both."""
    c, r = _sorted_top(cand_top), _sorted_top(ref_top)
    return len(c) >= 2 and len(r) >= 2 and not {t for _, t in c} & {t for _, t in r}


NO_LOGPROBS = "no log-probs on both sides: margin rule only"


def drift_text(drift: Drift, tolerance: float | None = None) -> str:
    """What made a drift onset: one position past the tolerance, or the running sum past the envelope."""
    if drift.envelope is not None:
        total, limit = drift.envelope
        return (f"log-prob drift summed over outputs 0-{drift.onset} {total:.3g} > the path's envelope "
                f"{limit:.3g} there (max {drift.value:.3g})")
    return f"log-prob drift {drift.value:.3g} from output {drift.onset}" + (
        f" > tolerance {tolerance:g}" if tolerance is not None else "")


def classify(cand: dict, ref: dict | None, threshold: float = MARGIN_THRESHOLD,
             tolerance: float = DRIFT_TOLERANCE, envelope: Envelope | None = None) -> Classification:
    """DESIGN.md 3.3 classification of one candidate record against its reference record (`envelope`: the
    pool's calibrated cumulative drift, reports/envelope.py; None: the tolerance alone)."""
    if cand.get("error"):
        return Classification("error", f"candidate error: {cand['error']}")
    if ref is None:
        return Classification("error", "no reference")
    if ref.get("error"):
        return Classification("error", f"reference error: {ref['error']}")
    c_out = list(cand.get("output_ids") or [])
    r_out = list(ref.get("output_ids") or [])
    p = first_divergence(c_out, r_out)
    flip = p if p is not None and p < min(len(c_out), len(r_out)) else None
    drift = logprob_drift(cand, ref, len(c_out) if p is None else p, tolerance, flip, envelope)
    if p is None:
        return decide(None, drift, None, None, None, None, threshold, tolerance)
    return decide(p, drift, _at(c_out, p), _at(r_out, p), _at(cand.get("output_top_logprobs"), p),
                  _at(ref.get("output_top_logprobs"), p), threshold, tolerance, len(c_out), len(r_out))


def decide(p: int | None, drift: Drift, cand_token: int | None, ref_token: int | None, cand_top: Sequence | None,
           ref_top: Sequence | None, threshold: float, tolerance: float, cand_len: int = 0,
           ref_len: int = 0) -> Classification:
    """The class of a candidate that answered, given its first divergence `p` (None: same tokens), its drift, the
    tokens and top-k lists at `p` and the two output lengths (shared by classify and reports/oracle_vec.py)."""
    unmeasured = "" if drift.measured else f" ({NO_LOGPROBS})"
    if p is None:
        if drift.onset is not None:
            return Classification("drift", drift_text(drift, tolerance), drift=drift)
        return Classification("exact", unmeasured.strip(" ()"), drift=drift)
    margin = top_margin(ref_top)
    rank = token_rank(ref_top, cand_token) if cand_token is not None else None
    fields = dict(first_divergence=p, ref_margin=margin, cand_rank=rank, cand_token=cand_token,
                  ref_token=ref_token, drift=drift)
    if cand_token is None or ref_token is None:
        # One output is a strict prefix of the other: no token flip to weigh, so not a numerics flip.
        return Classification("hard", f"length: candidate {cand_len} vs reference {ref_len} tokens", **fields)
    if drift.onset is not None:
        # The state had already left the reference's before (or at) the flip: whatever the margin, not numerics.
        where = f"before the flip at {p}" if drift.onset < p else "at the flip"
        return Classification("hard", f"{drift_text(drift)} {where}", **fields)
    if _disjoint(cand_top, ref_top):
        # A numerics flip swaps near-tied tokens, so both top-k lists hold both; disjoint ones are not numerics.
        return Classification("hard", f"the top-k at the flip (output {p}) share no token", **fields)
    if margin is None:
        return Classification("hard", "reference top-2 log-probs missing at divergence" + unmeasured, **fields)
    if margin < threshold:
        return Classification("soft", f"margin {margin:.4g} < {threshold:g}" + unmeasured, **fields)
    return Classification("hard", f"margin {margin:.4g} >= {threshold:g}" + unmeasured, **fields)
