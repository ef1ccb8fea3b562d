"""Named fault injections: faithful models of real bug classes, so specgate can prove it catches them.

Each fault is off unless `EngineConfig.inject_fault` names it. The code that a
fault alters asks `active(cfg, NAME)` at exactly the place the real bug lived;
names are the constants below, never string literals at the call site.
"""

from __future__ import annotations

from dataclasses import dataclass

STALE_SEQ_LENS = "stale-seq-lens"
TRACK_OFF_BY_ONE = "track-off-by-one"
CONV_NOT_TRACKED = "conv-not-tracked"
INSERT_WORKING_STATE = "insert-working-state"


@dataclass(frozen=True)
class Fault:
    """A registered fault: its flag name, one-line summary, and the bug it models."""

    name: str
    summary: str
    doc: str


FAULTS: dict[str, Fault] = {f.name: f for f in [
    Fault(
        STALE_SEQ_LENS,
        "SGLang #37817: checkpoint crossing test uses lengths before they are advanced",
        "After a DFlash verify step the worker decides whether the committed tokens crossed a "
        "track-interval boundary by comparing the pre-verify lengths with the batch's sequence "
        "lengths; those had not been advanced yet, so both sides were equal, no crossing was ever "
        "seen and the boundary state was never copied into the tracking slot. The scheduler still "
        "recorded the boundary as tracked (it uses the real lengths), so the radix cache inserted a "
        "node whose full-attention KV covers the boundary but whose linear state is stale. Nothing "
        "crashes; follow-up requests that resume there generate wrong tokens. Fixed upstream by "
        "PR #37818 (compare against post-verify lengths).",
    ),
    Fault(
        TRACK_OFF_BY_ONE,
        "tracking step one past the boundary (ith = boundary - pre instead of boundary - pre - 1)",
        "The step index of the boundary state is computed without the -1 that converts a token "
        "count into a step index, so the checkpoint saved for boundary b holds the state after "
        "b + 1 tokens (or nothing when the boundary is the last accepted token). A cache hit at b "
        "then replays token b twice through the linear layers: a classic fencepost bug in "
        "speculative state bookkeeping.",
    ),
    Fault(
        CONV_NOT_TRACKED,
        "checkpoint copies the recurrent state but not the conv window",
        "Linear-attention layers carry two pieces of state: the recurrent matrix and the causal "
        "conv window (the last K-1 inputs). Here the post-verify commit copies the boundary step's "
        "recurrent state into the tracking slot but leaves that slot's conv window as it was at the "
        "previous checkpoint. The error is small (only the first K-1 tokens after a resume see a "
        "wrong conv input) but it changes tokens: the bug class of state tuples committed "
        "piecewise.",
    ),
    Fault(
        INSERT_WORKING_STATE,
        "radix insertion stores the working state instead of the tracked checkpoint",
        "On finish the prefix up to the last tracked boundary is inserted into the radix cache, but "
        "the state stored with it is the request's working state (valid for the full final length), "
        "not the checkpoint taken at the boundary. The KV says 'boundary', the linear state says "
        "'end of request': a resume there continues from a state that has already seen the rest of "
        "the sequence.",
    ),
]}


def check_fault_name(name: str) -> None:
    """Raise ValueError listing the valid names if `name` is not a known fault."""
    if name not in FAULTS:
        raise ValueError(f"unknown fault {name!r}; valid faults: {', '.join(sorted(FAULTS))}")



def active(cfg, name: str) -> bool:
    """True when `cfg` (anything with `inject_fault`) injects fault `name` (a constant of this module)."""
    assert name in FAULTS, f"unregistered fault {name!r}"
    return cfg.inject_fault == name
