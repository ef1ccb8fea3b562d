"""Which verify step's linear state becomes the checkpoint (SGLang #37817 lives here).

During DFlash verification the linear-attention kernels keep one state per block
step: step i is the state after block token i, covering `pre + i + 1` tokens.
If the committed tokens carry the sequence across a multiple of the track
interval I, the state exactly at that boundary is step `boundary - pre - 1`,
and it must be copied into the tracking slot so the radix cache can later
resume there. #37817 compared `pre` against the *pre-verify* lengths on both
sides, so no crossing was ever seen; the lengths used here must be post-verify.
"""

from __future__ import annotations

import torch


def mamba_steps_to_track(
    seq_lens_pre_verify: torch.Tensor,  # [bs] committed length before the verify step
    seq_lens_post_verify: torch.Tensor,  # [bs] committed length after it (pre + commit_len)
    commit_lens: torch.Tensor,  # [bs] accepted drafts + 1
    track_interval: int,
) -> torch.Tensor:
    """Step index to copy into the tracking slot per request, -1 for none. LongTensor [bs]."""
    pre = seq_lens_pre_verify.to(torch.int64)
    post = seq_lens_post_verify.to(torch.int64)
    commit = commit_lens.to(torch.int64)
    crossed = pre // track_interval != post // track_interval
    boundary = post // track_interval * track_interval
    ith = torch.clamp(boundary - pre - 1, min=0)
    # the boundary must lie inside the accepted part of the block
    trackable = crossed & (ith < commit)
    return torch.where(trackable, ith, torch.full_like(ith, -1))
