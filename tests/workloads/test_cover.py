"""The cover suite: one session per (verify step holding the boundary, commit length) cell."""

from __future__ import annotations

import pytest

from protocol.boundaries import boundary_step, crossed_boundary
from protocol.tokenizer import BYTE_TOKENIZER
from workloads import load_suite
from workloads.cover import cover_cells, generate_cover, main
from workloads.schema import WorkloadError


def cycled_crossing(prompt_len: int, interval: int, block: int, max_new: int) -> tuple[int, int] | None:
    """(step, commit_len) of the first verify step crossing a boundary when step v commits (v mod B) + 1 tokens
    (the scripted drafter with --scripted-accept -1; prefill leaves the sequence at the prompt length)."""
    pre, v = prompt_len, 0
    while pre < prompt_len + max_new:
        commit = v % block + 1
        boundary = crossed_boundary(pre, pre + commit, interval)
        if boundary is not None:
            return boundary_step(pre, boundary), commit
        pre, v = pre + commit, v + 1
    return None


@pytest.mark.parametrize("interval, block", [(128, 8), (256, 8), (32, 4), (37, 8)])
def test_every_cell_once_and_its_prompt_reaches_it(interval, block):
    sessions = generate_cover((interval,), block)
    assert len(sessions) == block * (block + 1) // 2 == len(cover_cells(block))
    got = set()
    for s in sessions:
        cell = (s.meta["step"], s.meta["commit_len"])
        assert cycled_crossing(s.prompt_len, interval, block, s.turns[0].max_new_tokens) == cell
        assert s.prompt_len + s.turns[0].max_new_tokens == interval + 16  # turn 0 decodes past the boundary
        assert s.session_id == f"cover-i{interval}-s{cell[0]}-c{cell[1]}" and s.interval == interval
        got.add(cell)
    assert got == set(cover_cells(block))


def test_cells_are_ordered_by_commit_then_step():
    assert cover_cells(3) == [(0, 1), (0, 2), (1, 2), (0, 3), (1, 3), (2, 3)]


def test_prompts_are_text_and_the_suite_is_deterministic():
    a, b = generate_cover(), load_suite("cover")
    assert a == b and len(a) == 72
    assert len({s.turns[0].text for s in a}) == 72
    for s in a:
        assert s.turns[0].input_ids == tuple(BYTE_TOKENIZER.encode(s.turns[0].text))


def test_an_interval_too_small_for_the_longest_commits_is_refused():
    with pytest.raises(WorkloadError, match="interval 36 is too small .* need an interval >= 37"):
        generate_cover((36,), 8)


def test_describe(capsys):
    assert main(["--describe", "--intervals", "128"]) == 0
    out = capsys.readouterr().out
    assert "interval 128: 36 cells (step, commit length), turn-0 prompts 92..127 tokens" in out
    assert "total: 36 sessions, 72 requests per sweep point" in out
