"""Which verify step's linear state becomes the checkpoint (SGLang #37817 lives here).

During DFlash verification the linear-attention kernels keep one state per block
step: step i is the state after block token i, covering `pre + i + 1` tokens.
If the committed tokens carry the sequence across a multiple of the track
interval I, the state exactly at that boundary is step `boundary - pre - 1`,
and it must be copied into the tracking slot so the radix cache can later
resume there. #37817 compared `pre` against the *pre-verify* lengths on both
sides, so no crossing was ever seen; the lengths used here must be post-verify.
The arithmetic itself is `protocol.boundaries.step_to_track`, shared with the
workloads and the analyzer.
"""

from __future__ import annotations

import torch

from protocol.boundaries import step_to_track


def mamba_steps_to_track(
    seq_lens_pre_verify: torch.Tensor,  # [bs] committed length before the verify step
    seq_lens_post_verify: torch.Tensor,  # [bs] committed length after it (pre + commit_len)
    commit_lens: torch.Tensor,  # [bs] accepted drafts + 1
    track_interval: int,
) -> torch.Tensor:
    """Step index to copy into the tracking slot per request, -1 for none. LongTensor [bs]."""
    rows = zip(seq_lens_pre_verify.tolist(), seq_lens_post_verify.tolist(), commit_lens.tolist(), strict=True)
    return torch.tensor([step_to_track(p, q, c, track_interval) for p, q, c in rows], dtype=torch.int64)
