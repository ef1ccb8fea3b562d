"""Triton kernel for the post-verify state commit (torch reference: state_scatter_naive.py).

After a verify forward, every GDN layer holds one intermediate recurrent state
and one conv window per block step. For each request b and every layer l:

    rec_pool[l, working_slots[b]]  <- rec_inter[l, b, commit_steps[b]]     (commit_len - 1)
    rec_pool[l, track_slots[b]]    <- rec_inter[l, b, track_steps[b]]      (if track_steps[b] >= 0)

and the same for the conv windows. One launch does all of it: the grid is
(entry blocks of the recurrent state, then of the conv window; request x {commit, track}; layer).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.triton_jit import jit


@jit
def _copy_block(src, dst, i_blk, numel, BLOCK: tl.constexpr):
    """Copy elements [i_blk * BLOCK, (i_blk + 1) * BLOCK) of one contiguous entry."""
    offs = i_blk.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    vals = tl.load(src + offs, mask=mask)
    tl.store(dst + offs, vals.to(dst.dtype.element_ty), mask=mask)


@jit
def _state_scatter_kernel(
    rec_pool, rec_inter, conv_pool, conv_inter,
    working_slots, commit_steps, track_slots, track_steps,
    s_working, s_commit, s_track_slot, s_track_step,
    rp_l, rp_n, ri_l, ri_b, ri_t,
    cp_l, cp_n, ci_l, ci_b, ci_t,
    rec_numel, conv_numel, rec_blocks,
    BLOCK: tl.constexpr,
):
    i_blk = tl.program_id(0)
    i_req = tl.program_id(1)
    i_l = tl.program_id(2).to(tl.int64)
    b = i_req // 2
    is_track = (i_req % 2) == 1

    commit_step = tl.load(commit_steps + b * s_commit).to(tl.int64)
    track_step = tl.load(track_steps + b * s_track_step).to(tl.int64)
    working_slot = tl.load(working_slots + b * s_working).to(tl.int64)
    track_slot = tl.load(track_slots + b * s_track_slot).to(tl.int64)
    step = tl.where(is_track, track_step, commit_step)
    slot = tl.where(is_track, track_slot, working_slot)
    if step >= 0:  # -1: nothing to track for this request
        if i_blk < rec_blocks:
            _copy_block(rec_inter + i_l * ri_l + b * ri_b + step * ri_t, rec_pool + i_l * rp_l + slot * rp_n,
                        i_blk, rec_numel, BLOCK)
        else:
            _copy_block(conv_inter + i_l * ci_l + b * ci_b + step * ci_t,
                        conv_pool + i_l * cp_l + slot * cp_n, i_blk - rec_blocks, conv_numel, BLOCK)


def _entry_is_contiguous(t: torch.Tensor, lead: int) -> bool:
    """Whether each entry t[i_0, ..., i_{lead-1}] is one contiguous run of memory."""
    return t[(0,) * lead].is_contiguous() if t.numel() else True


def state_scatter_triton(
    rec_pool: torch.Tensor,  # [L, N, H, Dk, Dv]
    conv_pool: torch.Tensor,  # [L, N, C, K-1]
    rec_inter: torch.Tensor,  # [L, B, T, H, Dk, Dv]
    conv_inter: torch.Tensor,  # [L, B, T, C, K-1]
    working_slots: torch.Tensor,  # [B]
    commit_steps: torch.Tensor,  # [B] commit_len - 1, always >= 0
    track_slots: torch.Tensor,  # [B]
    track_steps: torch.Tensor,  # [B] -1 = no checkpoint
    *,
    block: int = 1024,
) -> None:
    """For every layer: pool[working] <- inter[commit_step]; pool[track] <- inter[track_step] where >= 0."""
    L, B = rec_inter.shape[:2]
    assert rec_pool.shape[0] == conv_pool.shape[0] == L and conv_inter.shape[:2] == (L, B), "layers/batch"
    assert rec_pool.shape[2:] == rec_inter.shape[3:], f"{rec_pool.shape} vs {rec_inter.shape}"
    assert conv_pool.shape[2:] == conv_inter.shape[3:], f"{conv_pool.shape} vs {conv_inter.shape}"
    assert rec_inter.shape[2] == conv_inter.shape[2], "rec and conv intermediates have different block sizes"
    for idx in (working_slots, commit_steps, track_slots, track_steps):
        assert idx.shape == (B,) and not idx.is_floating_point(), f"index tensor {idx.shape} for batch {B}"
    # An entry (one state or one window) is copied as a flat run of elements.
    assert _entry_is_contiguous(rec_pool, 2) and _entry_is_contiguous(rec_inter, 3), "recurrent entries"
    assert _entry_is_contiguous(conv_pool, 2) and _entry_is_contiguous(conv_inter, 3), "conv entries"
    if L == 0 or B == 0:
        return
    rec_numel = rec_pool[0, 0].numel()
    conv_numel = conv_pool[0, 0].numel()
    rec_blocks = triton.cdiv(rec_numel, block)
    grid = (rec_blocks + triton.cdiv(conv_numel, block), 2 * B, L)
    _state_scatter_kernel[grid](
        rec_pool, rec_inter, conv_pool, conv_inter,
        working_slots, commit_steps, track_slots, track_steps,
        working_slots.stride(0), commit_steps.stride(0), track_slots.stride(0), track_steps.stride(0),
        rec_pool.stride(0), rec_pool.stride(1), *rec_inter.stride()[:3],
        conv_pool.stride(0), conv_pool.stride(1), *conv_inter.stride()[:3],
        rec_numel, conv_numel, rec_blocks,
        BLOCK=block, num_warps=4,
    )
