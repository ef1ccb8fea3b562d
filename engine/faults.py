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
TRACK_DROPPED_ON_BATCH_CHANGE = "track-dropped-on-batch-change"
PINGPONG_DOUBLE_FLIP = "pingpong-double-flip"
CONV_ROLLBACK_WRONG_STEP = "conv-rollback-wrong-step"
PREFILL_CHECKPOINT_OFF_BOUNDARY = "prefill-checkpoint-off-boundary"
EVICT_MATCHED_CHECKPOINT = "evict-matched-checkpoint"
MATCH_PAST_CHECKPOINT = "match-past-checkpoint"
SPLIT_INHERITS_CHECKPOINT = "split-inherits-checkpoint"


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
    Fault(
        TRACK_DROPPED_ON_BATCH_CHANGE,
        "SGLang #39342 class: a verify step right after the batch changed runs without its tracking indices",
        "The running batch keeps one tracking slot per row. Filtering out finished requests or merging "
        "newly prefilled ones rebuilds the rows and drops those indices (SGLang's filter_batch / "
        "merge_batch reset mamba_track_indices to None); the decode path rebuilds them in "
        "prepare_for_decode, but the DFlash verify path used them as they were, so a verify step "
        "right after a composition change ran with no tracking indices and copied no checkpoint. "
        "The host still recorded the boundary from the real lengths, and the tree received the "
        "ping-pong slot that was never written. Only steps that both cross a boundary and follow "
        "a join or leave are hit: the first verify of a request whose prompt ends just below a "
        "boundary (it joined the batch that step), or a crossing while other requests join or "
        "finish, which concurrency makes common. Modelled "
        "on SGLang #39342 (tracking lost on batch composition changes) and PR #24613 (mixed-chunk "
        "merge left the decode rows' tracking indices None).",
    ),
    Fault(
        PINGPONG_DOUBLE_FLIP,
        "SGLang #32852 class: the ping-pong index flips twice per checkpoint, so the insert reads the other slot",
        "Each request has two tracking slots; a checkpoint is written to slot[next], then next "
        "flips so that slot[1 - next] names the last checkpoint, which the tree receives. Here the "
        "index is flipped a second time when a decode/verify checkpoint is recorded (a flip done "
        "both where the boundary is detected and again in result processing), so the "
        "copy lands in one slot and cache_unfinished_req / cache_finished_req donate the other, "
        "which holds an older checkpoint (or a fresh slot's leftovers) under the new length.",
    ),
    Fault(
        CONV_ROLLBACK_WRONG_STEP,
        "SGLang #26888, #34794 class: on partial acceptance the conv window is committed from the wrong step",
        "After a verify step the working state must be the intermediate of the last accepted "
        "token, step commit_len - 1, for the recurrent state and the conv window alike. Here the "
        "conv window is rolled back one step too little: when a draft was rejected it is committed "
        "from step commit_len, so it still holds the first rejected draft token's input. The "
        "recurrent state is right, so the error is small and local (the next K-1 tokens see one "
        "wrong conv input) but it changes tokens in the same request, with or without the cache, "
        "and every later checkpoint inherits it: the bug class of state pieces rolled back "
        "separately (the conv rollback kernels of NPU/CUDA backends, and short-conv models).",
    ),
    Fault(
        PREFILL_CHECKPOINT_OFF_BOUNDARY,
        "SGLang #33515, #37836 class: a prefill checkpoint labelled at the aligned position holds the extend's end",
        "A prefill extend checkpoints the deepest position aligned to the mamba cache chunk size, "
        "which is usually inside the extend (960 for a 1,000-token prompt). That state exists only "
        "as a chunk state of the chunked kernel (FLA's h); the final state is the extend's end. "
        "SGLang must pass a position that makes the backend read h (_force_track_h); when it "
        "reads the final state instead, the checkpoint recorded at 960 holds the state after "
        "1,000 tokens. The tree entry's KV covers 960 tokens and its linear state 1,000: a "
        "request that resumes there replays 40 tokens on top of a state that has seen them. Only "
        "extends whose length is not a multiple of the chunk size are hit.",
    ),
    Fault(
        EVICT_MATCHED_CHECKPOINT,
        "lock-before-evict (SGLang _match_post_processor): the matched node is locked only after allocation",
        "Admission matches a prefix, allocates the request's state slots (evicting tree "
        "checkpoints when the pool is short) and then restores the matched checkpoint into the "
        "working slot. SGLang locks the matched node before any eviction (inc_lock_ref, evict, "
        "dec_lock_ref around the copy-on-write allocation in _match_post_processor). Here the lock "
        "is taken after the slots are allocated, so when the pool is tight the eviction can free "
        "the matched checkpoint itself and hand that slot back as one of the request's own "
        "(zeroed) slots: the request reports the cached length but resumes from a zero state. "
        "Only admissions that evict under memory pressure are hit.",
    ),
    Fault(
        MATCH_PAST_CHECKPOINT,
        "SGLang #22935 class: a match returns the KV of nodes past the deepest checkpoint it restores",
        "A prefix match may resume only at the deepest node on its path that holds a linear-state "
        "checkpoint: a mamba state is a point value at a node's end depth and cannot be cut back like "
        "per-token KV, so SGLang's _match_post_processor truncates the matched KV to that node "
        "(value[:best_value_len]; the invariant PR #38597 pins). Issue #22935 reports the cost of "
        "that rule: a match that ends at a node a split created, which holds no checkpoint of its "
        "own, falls back to an ancestor's checkpoint and recomputes the rest. Here the match keeps "
        "the KV of every whole node it walked instead (cached_tokens counts them) while restoring "
        "the deepest checkpoint's state, so the linear layers skip the tokens between the two and "
        "continue from a state for a shorter prefix. Only a match whose deepest whole node holds no "
        "checkpoint (a node a split created: an edge split by a diverging sibling; or, under memory "
        "pressure, one whose checkpoint was evicted) is hit; a match that stops inside an edge keeps "
        "only whole nodes, since this engine splits edges on insertion (SGLang also splits on the "
        "match itself).",
    ),
    Fault(
        SPLIT_INHERITS_CHECKPOINT,
        "a node split off by a diverging insertion inherits its child's checkpoint (a longer prefix's state)",
        "Splitting an edge creates an upper node that must hold no linear-state checkpoint: its "
        "depth was never a resume point (SGLang's _split_node sets mamba_value = None, 'mamba cache "
        "can not be split'), unlike sliding-window or full-attention values, which split with the "
        "edge. Here, after an insertion split an edge and went on past the split into a branch of "
        "its own (a request diverging from a cached sibling), the split node, still without a "
        "checkpoint, gets a copy of its lower part's one: the state of the sibling's longer "
        "prefix, as a cache that copies node values on a split, or fills split nodes from the "
        "nearest checkpoint below them, would leave it. A later request whose match passes whole "
        "through that node and finds no deeper checkpoint resumes there from a state that has "
        "seen tokens it never sent. An insertion that ends at the split point adopts its own "
        "checkpoint as before, so only matches into nodes that diverging siblings split are hit.",
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
