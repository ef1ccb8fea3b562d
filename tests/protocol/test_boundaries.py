"""Boundary arithmetic: DESIGN.md's reference table, a brute force, and the helpers workloads and reports use."""

import random

import pytest

from protocol.boundaries import (
    boundaries_between,
    boundaries_upto,
    boundary_step,
    crossed,
    crossed_boundary,
    nearest_boundary_offset,
    next_boundary,
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
