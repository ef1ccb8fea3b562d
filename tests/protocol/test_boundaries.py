"""Boundary arithmetic: DESIGN.md's reference table, a brute force, and the helpers workloads and reports use."""

import random

import pytest

from protocol.boundaries import (
    boundaries_between,
    boundaries_upto,
    boundary_step,
    branching_point,
    chunk_extend_len,
    crossed,
    crossed_boundary,
    decode_tracks,
    mamba_cache_chunk_size,
    nearest_boundary_offset,
    next_boundary,
    prefill_track_position,
    step_to_track,
)

TABLE_256 = [  # pre, commit_len, post, step to track (DESIGN.md section 1)
    (255, 1, 256, 0),
    (254, 2, 256, 1),
    (250, 3, 253, -1),
    (256, 1, 257, -1),
    (250, 8, 258, 5),
    (248, 8, 256, 7),
    (256, 8, 264, -1),
]


@pytest.mark.parametrize("pre, commit, post, step", TABLE_256)
def test_design_table(pre, commit, post, step):
    assert step_to_track(pre, post, commit, 256) == step


def test_stale_post_never_tracks():
    """Bug #37817: the pre-verify length passed as the post-verify one."""
    assert [step_to_track(pre, pre, c, 256) for pre, c, _, _ in TABLE_256] == [-1] * len(TABLE_256)


def _brute(pre, commit, interval):
    for i in range(commit):  # step i covers pre + i + 1 tokens
        if (pre + i + 1) % interval == 0:
            return i
    return -1


def test_random_against_brute_force():
    rng = random.Random(0)
    for interval in (16, 64, 128, 256):
        for _ in range(500):
            pre, commit = rng.randrange(0, 4 * interval), rng.randint(1, 16)
            assert step_to_track(pre, pre + commit, commit, interval) == _brute(pre, commit, interval)


def test_crossing_helpers():
    assert crossed(255, 256, 256) and not crossed(256, 264, 256) and not crossed(250, 253, 256)
    assert crossed_boundary(250, 258, 256) == 256 and crossed_boundary(256, 257, 256) is None
    assert boundary_step(250, 256) == 5
    assert boundaries_between(120, 520, 128) == [128, 256, 384, 512] and boundaries_between(128, 255, 128) == []


@pytest.mark.parametrize(
    "length,interval,expected",
    [(0, 128, 128), (1, 128, 128), (127, 128, 128), (128, 128, 256), (129, 128, 256), (255, 256, 256),
     (256, 256, 512), (1022, 256, 1024)],
)
def test_next_boundary_is_strictly_above(length, interval, expected):
    assert next_boundary(length, interval) == expected


@pytest.mark.parametrize("length,interval,expected", [(127, 128, 0), (128, 128, 1), (383, 128, 2), (1024, 256, 4)])
def test_boundaries_upto(length, interval, expected):
    assert boundaries_upto(length, interval) == expected


@pytest.mark.parametrize("pos,interval,expected", [(257, 256, 1), (255, 256, -1), (256, 256, 0), (384, 256, 128),
                                                   (385, 256, -127), (0, 128, 0)])
def test_nearest_boundary_offset(pos, interval, expected):
    assert nearest_boundary_offset(pos, interval) == expected


# --- prefill checkpoints: SGLang's _mamba_radix_cache_v2_req_prepare_for_extend --------------------

PREFILL_TABLE = [  # prefix_len, extend_len, chunk, branching, tracked length (None: no checkpoint)
    (0, 1000, 64, None, 960),  # the example: one extend of a 1,000-token prompt
    (0, 63, 64, None, None),  # shorter than a chunk: no checkpoint at all
    (0, 64, 64, None, 64),
    (0, 65, 64, None, 64),
    (0, 127, 64, None, 64),
    (0, 128, 64, None, 128),
    (0, 255, 64, None, 192),
    (0, 256, 64, None, 256),  # on the grid: the extend's end (its final state)
    (0, 257, 64, None, 256),
    (0, 512, 64, None, 512),  # first 512-token chunk of a longer prompt
    (512, 488, 64, None, 960),  # its second chunk: 1,000 tokens in chunks of 512 -> 512 and 960
    (256, 256, 64, None, 512),  # SGLang's own unit test (prefix 256, extend 256)
    (8192, 3136, 64, None, 11328),
    (0, 15734, 64, None, 15680),
    (16, 100, 64, None, 80),  # the grid counts from the extend's start (prefix 16 is off the 64-grid)
    (128, 60, 64, None, None),
    (0, 1000, 128, None, 896),  # page size 128: chunk max(64, 128)
    (0, 1000, 64, 640, 640),  # a branching point strictly inside, on the grid, wins
    (0, 1000, 64, 650, 960),  # off the grid: ignored
    (0, 1000, 64, 1000, 960),  # at the end: not strictly inside
    (640, 360, 64, 640, 960),  # at the start (the restored prefix): not strictly inside
    (0, 63, 64, 0, None),
]


@pytest.mark.parametrize("prefix, extend, chunk, branching, expected", PREFILL_TABLE)
def test_prefill_checkpoint_positions(prefix, extend, chunk, branching, expected):
    assert prefill_track_position(prefix, extend, chunk, branching) == expected


def test_prefill_checkpoint_is_the_deepest_grid_position_of_the_extend():
    """Brute force: no deeper grid position inside the extend; at most one per extend."""
    for prefix in (0, 16, 64, 128, 496):
        for extend in range(1, 400):
            pos = prefill_track_position(prefix, extend, 64)
            grid = [p for p in range(prefix + 64, prefix + extend + 1, 64)]
            assert pos == (grid[-1] if grid else None)


def test_prefill_checkpoints_are_not_interval_multiples():
    """Unlike decode/verify checkpoints: a 1,000-token prompt is checkpointed at 960, not 256/512/768."""
    assert prefill_track_position(0, 1000, mamba_cache_chunk_size(16)) == 960
    assert [b for b in boundaries_between(0, 1000, 256)] == [256, 512, 768]


@pytest.mark.parametrize("page_size, chunk", [(1, 64), (16, 64), (64, 64), (128, 128), (256, 256)])
def test_mamba_cache_chunk_size(page_size, chunk):
    assert mamba_cache_chunk_size(page_size) == chunk


BRANCHING_TABLE = [  # KV matched, checkpoint resumed at, chunk, branching point
    (700, 0, 64, 640),  # another request's prompt shares 700 tokens, no checkpoint on the way
    (688, 640, 64, 640),  # aligned down to the resumed checkpoint itself: no use inside the extend
    (60, 0, 64, None),  # aligns to 0
    (640, 640, 64, None),  # the KV match ends at the checkpoint
    (1000, 512, 128, 896),
]


@pytest.mark.parametrize("kv_len, cached, chunk, expected", BRANCHING_TABLE)
def test_branching_point(kv_len, cached, chunk, expected):
    assert branching_point(kv_len, cached, chunk) == expected


DECODE_VERIFY_TABLE = [  # interval, pre, tokens committed, speculative, checkpoint length (None: none)
    (256, 254, 1, False, None),
    (256, 255, 1, False, 256),  # decode: the step that reaches the boundary
    (256, 256, 1, False, None),
    (128, 127, 1, False, 128),
    (256, 255, 1, True, 256),  # verify rows: DESIGN.md's table
    (256, 254, 2, True, 256),
    (256, 250, 3, True, None),
    (256, 250, 8, True, 256),
    (256, 248, 8, True, 256),
    (256, 256, 8, True, None),
    (128, 1020, 8, True, 1024),
]


@pytest.mark.parametrize("interval, pre, commit, spec, expected", DECODE_VERIFY_TABLE)
def test_decode_and_verify_checkpoint_positions(interval, pre, commit, spec, expected):
    post = pre + commit
    if spec:
        step = step_to_track(pre, post, commit, interval)
        assert (pre + step + 1 if step >= 0 else None) == expected
    else:
        assert (post if decode_tracks(post, interval) else None) == expected
    assert crossed_boundary(pre, post, interval) == expected


CHUNK_TABLE = [  # prompt tokens left, budget, page size, tokens prefilled this step
    (1000, 512, 16, 512),
    (488, 512, 16, 488),  # the rest fits: the whole rest, page-aligned or not
    (1000, 391, 16, 384),  # a shared budget's remainder: cut to whole pages
    (1000, 10, 16, 0),  # less than a page left: wait
    (1000, 391, 1, 391),
]


@pytest.mark.parametrize("remaining, budget, page, expected", CHUNK_TABLE)
def test_chunk_extend_len(remaining, budget, page, expected):
    assert chunk_extend_len(remaining, budget, page) == expected
