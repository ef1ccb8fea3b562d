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
