"""Track-interval boundary arithmetic (DESIGN.md section 1), the one copy of it.

A boundary is a positive multiple of the track interval I: the lengths at which
the extra_buffer strategy checkpoints the linear-attention state during decode
and verify. A verify step that commits `commit_len` tokens after `pre` covers
lengths pre+1 .. post (post = pre + commit_len); its step i holds the state after
pre + i + 1 tokens. The engine (which step to copy), the workloads (where to put
prompts) and the analyzer (which boundary a mismatch belongs to) all use these.
"""

from __future__ import annotations


def crossed(pre: int, post: int, interval: int) -> bool:
    """True when growing from `pre` to `post` tokens passes a multiple of `interval`."""
    return pre // interval != post // interval


def crossed_boundary(pre: int, post: int, interval: int) -> int | None:
    """The (deepest) boundary in (pre, post], or None; with post - pre <= I there is at most one."""
    return post // interval * interval if crossed(pre, post, interval) else None


def boundary_step(pre: int, boundary: int) -> int:
    """Index of the verify step whose state covers exactly `boundary` tokens (step i covers pre + i + 1)."""
    return boundary - pre - 1


def step_to_track(pre: int, post: int, commit_len: int, interval: int) -> int:
    """The verify step to copy into the tracking slot, -1 for none.

    SGLang's rule: only when the lengths cross a boundary, and only if the boundary
    lies inside the accepted part of the block (`step < commit_len`). `post` must be
    the post-verify length; passing the pre-verify one is bug #37817.
    """
    boundary = crossed_boundary(pre, post, interval)
    if boundary is None:
        return -1
    step = max(boundary_step(pre, boundary), 0)
    return step if step < commit_len else -1


def next_boundary(length: int, interval: int) -> int:
    """The first boundary strictly above `length` (a sequence on a boundary gets the next one)."""
    return (length // interval + 1) * interval


def boundaries_upto(length: int, interval: int) -> int:
    """How many boundaries lie in (0, length]: the checkpoints a sequence of `length` tokens passes."""
    return length // interval


def boundaries_between(start: int, end: int, interval: int) -> list[int]:
    """Boundaries b with start < b <= end."""
    return list(range(next_boundary(start, interval), end + 1, interval))


def nearest_boundary_offset(pos: int, interval: int) -> int:
    """Signed offset of `pos` from the nearest multiple of `interval`, in (-I/2, I/2].

    Positive means past the boundary: 257 -> +1 and 255 -> -1 at I = 256.
    """
    r = pos % interval
    return r if 2 * r <= interval else r - interval


# --- prefill checkpoints (SGLang's extra_buffer rule for extend forwards) ---------------------
#
# Decode and verify steps checkpoint at multiples of the track interval (above). A prefill
# ("extend") forward does not: SGLang takes at most one checkpoint per extend, at the deepest
# position aligned to the mamba cache chunk size counted from the extend's start, read from
# the chunked kernel's intermediate state there (`ScheduleBatch.
# _mamba_radix_cache_v2_req_prepare_for_extend`). A 1,000-token prompt prefilled in one extend
# is checkpointed at 960, not at 256/512/768.

FLA_CHUNK_SIZE = 64  # the chunked delta-rule kernel's chunk: its intermediate states sit at multiples of it


def mamba_cache_chunk_size(page_size: int) -> int:
    """SGLang's mamba_cache_chunk_size: max(64, page size); prefill checkpoints sit on its grid."""
    return max(FLA_CHUNK_SIZE, page_size)


def prefill_track_position(prefix_len: int, extend_len: int, chunk: int,
                           branching: int | None = None) -> int | None:
    """The length at which an extend of `extend_len` tokens after `prefix_len` is checkpointed, or None.

    None when the extend is shorter than one chunk. Otherwise the deepest chunk-aligned position
    of the extend, `prefix_len + extend_len // chunk * chunk`, unless the request's branching
    point (see `branching_point`) lies strictly inside the extend on the same grid: then that.
    """
    if extend_len < chunk:
        return None
    end = prefix_len + extend_len
    if branching is not None and prefix_len < branching < end and (branching - prefix_len) % chunk == 0:
        return branching
    return prefix_len + extend_len // chunk * chunk


def branching_point(kv_matched_len: int, checkpoint_len: int, chunk: int) -> int | None:
    """SGLang's mamba_branching_seqlen: where a prefix match's KV outruns its deepest checkpoint.

    A radix match resumes at its deepest checkpoint (`checkpoint_len`) but may match KV further
    (`kv_matched_len`, e.g. the shared part of another request's prompt). The chunk-aligned
    position of that KV match is then worth a checkpoint of its own, so a third request with the
    same prefix can resume there; None when the KV match ends at the checkpoint or aligns to 0.
    """
    if kv_matched_len <= checkpoint_len:
        return None
    aligned = kv_matched_len // chunk * chunk
    return aligned if aligned > 0 else None


def decode_tracks(new_len: int, interval: int) -> bool:
    """A non-speculative decode step that brings the sequence to `new_len` tokens checkpoints it here."""
    return new_len % interval == 0


def chunk_extend_len(remaining: int, budget: int, page_size: int) -> int:
    """Tokens of a prompt to prefill this step under a token budget (SGLang's PrefillAdder truncation).

    The whole rest if the budget allows; else the budget cut down to whole pages, so a cut prompt
    is inserted into the radix tree page by page (0 means: wait for a larger budget).
    """
    if remaining <= budget:
        return remaining
    return budget // page_size * page_size
