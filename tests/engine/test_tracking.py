"""mamba_steps_to_track: the engine's batched form of protocol.boundaries.step_to_track (DESIGN.md table)."""

import pytest
import torch

from engine.spec.tracking import mamba_steps_to_track
from tests.protocol.test_boundaries import TABLE_256


def _run(rows, interval, pre_dtype=torch.int64, post_dtype=torch.int64, commit_dtype=torch.int64):
    pre = torch.tensor([r[0] for r in rows], dtype=pre_dtype)
    commit = torch.tensor([r[1] for r in rows], dtype=commit_dtype)
    post = torch.tensor([r[2] for r in rows], dtype=post_dtype)
    return mamba_steps_to_track(pre, post, commit, interval)


def test_reference_table_at_256():
    out = _run(TABLE_256, 256)
    assert out.dtype == torch.int64
    assert out.tolist() == [r[3] for r in TABLE_256]


@pytest.mark.parametrize("interval", [64, 128])
def test_table_scaled(interval):
    # shift every length so the boundary 256 becomes `interval`; commits are unchanged
    rows = [(p - 256 + interval, c, q - 256 + interval, s) for p, c, q, s in TABLE_256]
    assert _run(rows, interval).tolist() == [r[3] for r in TABLE_256]


@pytest.mark.parametrize("dtypes", [(torch.int32, torch.int64, torch.int64), (torch.int64, torch.int32, torch.int32),
                                    (torch.int32, torch.int32, torch.int64), (torch.int32, torch.int32, torch.int32)])
def test_int32_int64_mixes(dtypes):
    assert _run(TABLE_256, 256, *dtypes).tolist() == [r[3] for r in TABLE_256]


def test_stale_lengths_never_track():
    """The #37817 call: post-verify lengths replaced by the pre-verify ones."""
    pre = torch.tensor([r[0] for r in TABLE_256])
    commit = torch.tensor([r[1] for r in TABLE_256])
    assert mamba_steps_to_track(pre, pre, commit, 256).tolist() == [-1] * len(TABLE_256)
