"""The oracle: how one candidate output compares with its cold-path reference (DESIGN.md 3.3).

Classes: `exact` (same tokens), `soft` (the reference's top-1/top-2 log-prob margin
at the first divergence is strictly below the threshold: a numerics flip), `hard`
(any other divergence: the signature of a state bug), `error` (the request, or its
reference, failed or is missing). Pure functions over records.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

CLASSES = ("exact", "soft", "hard", "error")
MARGIN_THRESHOLD = 0.5  # reference top-1/top-2 log-prob margin below which a flip is soft


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


def first_divergence(cand: Sequence[int], ref: Sequence[int]) -> int | None:
    """First output index where the two token lists differ (shorter length if one is a prefix); None if equal."""
    for i, (a, b) in enumerate(zip(cand, ref, strict=False)):
        if a != b:
            return i
    return None if len(cand) == len(ref) else min(len(cand), len(ref))


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


def _at(seq: Sequence | None, i: int):
    return seq[i] if seq is not None and 0 <= i < len(seq) else None


def classify(cand: dict, ref: dict | None, threshold: float = MARGIN_THRESHOLD) -> Classification:
    """DESIGN.md 3.3 classification of one candidate record against its reference record."""
    if cand.get("error"):
        return Classification("error", f"candidate error: {cand['error']}")
    if ref is None:
        return Classification("error", "no reference")
    if ref.get("error"):
        return Classification("error", f"reference error: {ref['error']}")
    c_out = list(cand.get("output_ids") or [])
    r_out = list(ref.get("output_ids") or [])
    p = first_divergence(c_out, r_out)
    if p is None:
        return Classification("exact", "")
    ref_top = _at(ref.get("output_top_logprobs"), p)
    margin = top_margin(ref_top)
    cand_token, ref_token = _at(c_out, p), _at(r_out, p)
    rank = token_rank(ref_top, cand_token) if cand_token is not None else None
    fields = dict(first_divergence=p, ref_margin=margin, cand_rank=rank, cand_token=cand_token,
                  ref_token=ref_token)
    if cand_token is None or ref_token is None:
        # One output is a strict prefix of the other: no token flip to weigh, so not a numerics flip.
        return Classification("hard", f"length: candidate {len(c_out)} vs reference {len(r_out)} tokens",
                              **fields)
    if margin is None:
        return Classification("hard", "reference top-2 log-probs missing at divergence", **fields)
    if margin < threshold:
        return Classification("soft", f"margin {margin:.4g} < {threshold:g}", **fields)
    return Classification("hard", f"margin {margin:.4g} >= {threshold:g}", **fields)
