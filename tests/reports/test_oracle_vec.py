"""The array oracle (reports/oracle_vec.py) against the record oracle (reports/oracle.py): equal Classifications
on seeded random candidate/reference pairs, regular ones (the array path) and odd ones (the fallback)."""

from __future__ import annotations

import math
import random

import numpy as np
import pyarrow as pa
import pytest

from records.columns import TOP_IDS, TOP_LOGPROBS, to_batch
from reports.envelope import LADDER, Envelope
from reports.oracle import classify
from reports.oracle_vec import Side, classify_batch

F32 = np.float32


def _lp(rng: random.Random) -> float:
    return float(F32(-rng.random() * 3))


def _side(rng: random.Random, base: list[int], k: int, odd: bool) -> dict:
    """Output ids from `base` (perturbed), with log-probs and top-k of `k` entries (some positions odd)."""
    out = list(base)
    if out and rng.random() < 0.5:
        out[rng.randrange(len(out))] = rng.randrange(8)  # a flip
    if rng.random() < 0.15:
        out = out[: rng.randrange(len(out) + 1)]  # a strict prefix
    rec: dict = {"output_ids": out, "error": None}
    mode = rng.random()
    if mode < 0.1:
        return rec  # no log-probs at all
    rec["output_logprobs"] = [_lp(rng) for _ in out] if mode > 0.2 else []
    top = []
    for tok in out:
        ids = rng.sample([t for t in range(-1, 8) if t != tok], k)  # distinct ids, the chosen one often first
        if ids and rng.random() < 0.7:
            ids[0] = tok
        entries = [[_lp(rng), t] for t in ids]
        entries.sort(key=lambda e: -e[0]) if rng.random() < 0.8 else None
        top.append(entries)
    rec["output_top_logprobs"] = top if mode > 0.3 else []
    if odd and out:
        what = rng.randrange(4)
        if what == 0 and rec["output_logprobs"]:
            rec["output_logprobs"][rng.randrange(len(out))] = math.nan
        elif what == 1 and rec["output_logprobs"]:
            rec["output_logprobs"] = rec["output_logprobs"][:-1]  # shorter than the output
        elif what == 2 and top:
            top[rng.randrange(len(top))] = [[-0.5, 3], [-0.6, 3]]  # a token twice
        elif what == 3 and top:
            top[rng.randrange(len(top))] = [[_lp(rng), j] for j in range(12)]  # wider than K_MAX
    return rec


def _pairs(seed: int, n: int, odd: float, k: int | None = None) -> list[tuple[dict, dict | None]]:
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        base = [rng.randrange(8) for _ in range(rng.randrange(0, 12))]
        width = k if k is not None else rng.choice([0, 1, 2, 2, 2, 3])
        cand, ref = _side(rng, base, width, rng.random() < odd), _side(rng, base, width, rng.random() < odd)
        # near-equal log-probs, so that drift is sometimes within the tolerance
        if rng.random() < 0.5 and "output_logprobs" in ref:
            cand["output_logprobs"] = [float(F32(x + rng.choice([0.0, 1e-4, 1e-2]))) for x in ref["output_logprobs"]]
            cand["output_top_logprobs"] = [[[float(F32(lp + 1e-5)), t] for lp, t in e]
                                           for e in ref.get("output_top_logprobs", [])]
            cand["output_ids"] = list(ref["output_ids"])
        if rng.random() < 0.05:
            cand["error"] = "boom"
        if rng.random() < 0.05:
            ref["error"] = "ref boom"
        pairs.append((cand, None if rng.random() < 0.05 else ref))
    return pairs


def _columns(recs: list[dict]) -> pa.RecordBatch:
    return to_batch([{"key": str(i), **r} for i, r in enumerate(recs)], lambda r: True)


def _vector(pairs, threshold=0.5, tolerance=1e-3, envelopes=None):
    cands = _columns([c for c, _ in pairs])
    refs = _columns([r or {"output_ids": []} for _, r in pairs])
    sides = [Side.of(b.column("output_ids"), b.column("output_logprobs"), b.column(TOP_LOGPROBS),
                     b.column(TOP_IDS), pad) for b, pad in ((cands, -(1 << 40)), (refs, -(1 << 41)))]
    extra = [e is not None for e in cands.column("_extra").to_pylist()]  # NaN lists, ids out of range: fallback
    extra_r = [e is not None for e in refs.column("_extra").to_pylist()]
    irregular = np.array(extra) | np.array(extra_r)
    cand_side = Side(**{**sides[0].__dict__, "irregular": sides[0].irregular | irregular})
    n = len(pairs)
    fell_back = []

    def fallback(i):
        fell_back.append(i)
        return pairs[i]

    out = classify_batch(cand_side, sides[1], [c.get("error") for c, _ in pairs],
                         [r.get("error") if r else None for _, r in pairs],
                         np.array([r is not None for _, r in pairs]), np.full(n, threshold), np.full(n, tolerance),
                         fallback, envelopes)
    return out, fell_back


@pytest.mark.parametrize("seed,k", [(s, k) for s in range(4) for k in (None, 2)])
def test_regular_pairs_are_classified_by_the_arrays_exactly_as_by_the_record_oracle(seed, k):
    pairs = _pairs(seed, 400, odd=0.0, k=k)  # k=2 everywhere: top-k lists packed back to back (a reshape)
    got, fell_back = _vector(pairs)
    want = [classify(c, r, 0.5, 1e-3) for c, r in pairs]
    assert got == want
    assert not fell_back  # every pair was decided by the array path
    assert {c.cls for c in want} == {"exact", "drift", "soft", "hard", "error"}  # every class is exercised


@pytest.mark.parametrize("seed,k", [(s, k) for s in range(3) for k in (None, 2)])
def test_odd_pairs_fall_back_to_the_record_oracle_and_agree(seed, k):
    pairs = _pairs(100 + seed, 300, odd=0.3, k=k)
    got, fell_back = _vector(pairs, threshold=0.3, tolerance=1e-4)
    assert got == [classify(c, r, 0.3, 1e-4) for c, r in pairs]
    assert 0 < len(fell_back) < len(pairs)


def test_a_batch_with_no_top_k_anywhere():
    pairs = [({"output_ids": [1, 2, 3], "output_logprobs": [-0.5, -0.25, -1.0], "error": None},
              {"output_ids": [1, 2, 4], "output_logprobs": [-0.5, -0.125, -1.0], "error": None}),
             ({"output_ids": [], "error": None}, {"output_ids": [], "error": None})]
    got, fell_back = _vector(pairs)
    assert got == [classify(c, r) for c, r in pairs] and not fell_back
    assert got[0].cls == "hard" and got[0].drift.onset == 1 and got[1].cls == "exact" and got[1].drift.value == 0.0


@pytest.mark.parametrize("odd", [0.0, 0.3])
def test_envelopes_are_applied_by_the_arrays_exactly_as_by_the_record_oracle(odd):
    pairs = _pairs(7 if odd else 8, 400, odd=odd)
    rng = random.Random(3)
    # a loose tolerance, so that the envelope (its limits near the pairs' sums) decides many onsets; some rows have
    # none, as in a run whose controls are analyzed without one
    envelopes = [None if rng.random() < 0.2 else Envelope(tuple(rng.choice([1e-3, 3e-3, 2e-2]) * n for n in LADDER))
                 for _ in pairs]
    got, _ = _vector(pairs, tolerance=0.5, envelopes=envelopes)
    want = [classify(c, r, 0.5, 0.5, e) for (c, r), e in zip(pairs, envelopes, strict=True)]
    assert got == want
    assert sum(1 for c in want if c.drift.envelope is not None) >= 20  # the envelope set those onsets
