"""Whether a run exercised what it gates: the evidence a PASS needs (the INCONCLUSIVE verdict's conditions).

A candidate pool that caches (radix cache on: `full`, `cache_only`) must restore a
checkpoint; one that speculates (`full`, `spec_only`) must accept draft tokens and
cross a checkpoint boundary inside a verify step (from `spec_trace`, or inferred from
positions where the engine reports none); the full pools must reach at least
`min_coverage` of the (verify step, commit length) boundary cells of their block
size, crossed and restored (reports/coverage.py; measurable only with `spec_trace`).
Where no record says what was accepted (vLLM reports no per-request verify counts), the
acceptance comes from the server's own counters over the run (server_counters.json).
Each finding says what was not exercised and what to change. Calibration controls
(harness/calibrate.py) are not gated and not checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from reports.coverage import cell_hits, cells
from reports.facts import TokenFacts

CACHING = ("full", "cache_only")
SPECULATIVE = ("full", "spec_only")


@dataclass(frozen=True)
class Unexercised:
    """One thing a pool did not exercise: `what` (the evidence) and `change` (flags, suite, drafter)."""

    pool: str
    check: str  # "restore", "acceptance", "verify-crossing", "coverage"
    what: str
    change: str

    def text(self) -> str:
        """One line for the report's first screen."""
        return f"pool {self.pool}: {self.what}; {self.change}"


def _accepted(g: pd.DataFrame) -> int | None:
    """Draft tokens accepted in the pool: from spec_trace (commit lengths past the bonus token), else from the
    counters (completion tokens past the prefill's token and one per verify step); None when neither is reported."""
    counted = g.dropna(subset=["spec_verify_ct"])
    counted = counted[counted["spec_verify_ct"] > 0]
    if not len(counted):
        return None
    extra = counted["completion_tokens"].astype(float) - 1 - counted["spec_verify_ct"].astype(float)
    return int(extra.clip(lower=0).sum())


DRAFTED, ACCEPTED = "vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total"


def server_acceptance(counters: Mapping) -> dict[str, tuple[int, int]]:
    """Per pool (accepted, drafted) draft tokens over the run, from server_counters.json (harness/backends/
    metrics.py: per pool and URL the counters' `delta`), for the pools whose servers count drafts."""
    out = {}
    for pool, urls in counters.items():
        deltas = [e.get("delta", {}) for e in urls.values() if isinstance(e, dict)]
        if any(DRAFTED in d for d in deltas):
            out[str(pool)] = (int(sum(d.get(ACCEPTED, 0.0) for d in deltas)),
                              int(sum(d.get(DRAFTED, 0.0) for d in deltas)))
    return out


def _pool_findings(pool: str, g: pd.DataFrame, facts: TokenFacts, min_coverage: float,
                   counted: tuple[int, int] | None = None) -> list[Unexercised]:
    answered = g[g["class"] != "error"]
    if not len(answered):
        return []  # a pool that answered nothing is the errors' business (the gate fails it)
    variant = str(answered["variant"].iloc[0])
    out = []
    if variant in CACHING and not answered["restored"].any():
        out.append(Unexercised(pool, "restore", f"the radix cache restored no checkpoint in {len(answered)} "
                               "answered requests (cached_tokens 0 everywhere): prefix caching was not exercised",
                               "check the candidate's flags (--candidate-args --disable-radix-cache, a tiny "
                               "--max-state-slots) and use a suite with multi-turn sessions (--suite frozen)"))
    if variant not in SPECULATIVE:
        return out
    counts = facts.accepted(answered["key"])
    if any(n is not None for n in counts):
        accepted = sum(n for n in counts if n is not None)
    else:
        accepted = _accepted(answered)
    evidence = "every verify step committed only its bonus token"
    if accepted is None and counted is not None:
        accepted, evidence = counted[0], f"the server's counters: 0 of {counted[1]} draft tokens accepted"
    if accepted == 0:
        out.append(Unexercised(pool, "acceptance", f"no draft token was accepted in {len(answered)} answered "
                               f"requests ({evidence}): speculative verify was not exercised, every output token "
                               "came from the target's own forward", "check the drafter (its model, "
                               "--drafter-mode) and the speculative flags (--block-size, the method)"))
    if int(answered["n_crossings"].fillna(0).sum()) == 0:
        source = "spec_trace" if (answered["crossing_source"] == "reported").any() else "positions"
        out.append(Unexercised(pool, "verify-crossing", f"no checkpoint boundary was crossed inside a verify "
                               f"step (from {source}): the #37817 path was not exercised", "use a suite whose "
                               "turns decode across multiples of the interval (--suite frozen) or smaller "
                               "--intervals"))
    elif variant == "full" and answered["restored"].any():  # with no restore at all, `restore` says it already
        out += _coverage_findings(pool, answered, min_coverage)
    return out


def _coverage_findings(pool: str, answered: pd.DataFrame, min_coverage: float) -> list[Unexercised]:
    reported = answered[answered["crossing_source"] == "reported"]
    if not len(reported) or answered["block_size"].dropna().empty:
        return []  # the engine reports no verify steps: cells cannot be measured (the report says so)
    block = int(answered["block_size"].dropna().max())
    hits = cell_hits(reported)
    restored = hits[hits["kind"] == "restored"][["step", "commit_len"]].drop_duplicates()
    total = len(cells(block))
    share = len(restored) / total
    if share + 1e-12 >= min_coverage:
        return []
    return [Unexercised(pool, "coverage", f"{len(restored)} of the {total} (verify step, commit length) boundary "
                        f"cells of B={block} were crossed and restored ({100 * share:.0f}% < --min-coverage "
                        f"{min_coverage:g})", "use the default frozen suite at more concurrencies, --cover (a "
                        "scripted drafter that walks every cell), or lower --min-coverage")]


def unexercised(df: pd.DataFrame, facts: TokenFacts, min_coverage: float,
                counted: Mapping[str, tuple[int, int]] | None = None) -> list[Unexercised]:
    """What the candidate pools of a requests frame did not exercise (empty: everything the gate checks); the draft
    tokens accepted come from `facts` (reports/facts.py: from spec_trace, None where a record has none), else from
    the records' verify counts, else from `counted` (server_acceptance: the servers' counters per pool)."""
    out = []
    for pool, g in df.groupby("pool", sort=True):
        out += _pool_findings(str(pool), g, facts, min_coverage, (counted or {}).get(str(pool)))
    return out
