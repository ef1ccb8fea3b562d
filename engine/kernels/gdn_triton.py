"""Triton kernel for the Gated DeltaNet hot path: the fused recurrent delta rule (reference: gdn_naive.py).

It works on the linear-state pool directly (one layer, per-sequence slot
indices) and has the two modes of the torch reference:

* decode/extend (`intermediate is None`): the pool states advance in place;
* verify (`intermediate` given): the pool is read, never written, and the state
  after every block step goes to `intermediate` for `state_scatter` to commit.

In decode/extend mode a sequence may also checkpoint: `track_steps[b] >= 0` stores
the state after that step to `pool[track_slots[b]]` from registers, mid-loop (a
prefill checkpoint at a chunk-aligned position, like FLA's `h`), so the rest of the
extend still runs on the fp32 state whatever the pool dtype.

The grid is (V-blocks, batch x value-heads): each program keeps one [Dk, BV]
fp32 state tile in registers for all T steps, so the state crosses memory once
in and once out (decode) or once per step (verify).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.triton_jit import _sum, check_slots, jit


@jit
def _gdn_recurrent_kernel(
    q, k, v, g, beta,  # contiguous [B, T, HQ, DK] x2, [B, T, H, DV], [B, T, H] x2
    o,  # [B, T, H, DV]
    pool, slots, inter,  # pool [N, H, DK, DV]; slots [B]; inter [B, T, H, DK, DV] (verify only)
    track_slots, track_steps,  # [B] each (TRACK only): checkpoint slot, step whose state it gets (< 0: none)
    scale, T, slot_stride,
    sp_n, sp_h, sp_k, sp_v,
    si_b, si_t, si_h, si_k, si_v,
    H: tl.constexpr, HQ: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, VERIFY: tl.constexpr, TRACK: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    i_hq = i_h // (H // HQ)  # grouped heads: H // HQ value heads share one q/k head

    offs_k = tl.arange(0, BK)
    offs_v = i_v * BV + tl.arange(0, BV)
    mask_k = offs_k < DK
    mask_v = offs_v < DV
    mask_kv = mask_k[:, None] & mask_v[None, :]

    slot = tl.load(slots + i_b * slot_stride).to(tl.int64)
    p_state = pool + slot * sp_n + i_h * sp_h + offs_k[:, None] * sp_k + offs_v[None, :] * sp_v
    # Masked rows/columns load as 0 and stay 0: k and v are 0 there too.
    state = tl.load(p_state, mask=mask_kv, other=0.0).to(tl.float32)  # [BK, BV]

    track_step = -1
    p_track = p_state
    if TRACK:
        track_step = tl.load(track_steps + i_b).to(tl.int32)
        track_slot = tl.load(track_slots + i_b).to(tl.int64)
        p_track = pool + track_slot * sp_n + i_h * sp_h + offs_k[:, None] * sp_k + offs_v[None, :] * sp_v

    p_inter = inter + i_b.to(tl.int64) * si_b + i_h * si_h + offs_k[:, None] * si_k + offs_v[None, :] * si_v
    tok0 = i_b.to(tl.int64) * T
    for t in range(T):
        tok = tok0 + t
        b_q = tl.load(q + (tok * HQ + i_hq) * DK + offs_k, mask=mask_k, other=0.0).to(tl.float32) * scale
        b_k = tl.load(k + (tok * HQ + i_hq) * DK + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        b_v = tl.load(v + (tok * H + i_h) * DV + offs_v, mask=mask_v, other=0.0).to(tl.float32)
        b_g = tl.load(g + tok * H + i_h).to(tl.float32)
        b_beta = tl.load(beta + tok * H + i_h).to(tl.float32)

        state = state * tl.exp(b_g)
        b_u = b_beta * (b_v - _sum(state * b_k[:, None], 0))  # [BV]
        state = state + b_k[:, None] * b_u[None, :]
        b_o = _sum(state * b_q[:, None], 0)  # [BV]
        tl.store(o + (tok * H + i_h) * DV + offs_v, b_o.to(o.dtype.element_ty), mask=mask_v)
        if VERIFY:
            tl.store(p_inter + t * si_t, state.to(inter.dtype.element_ty), mask=mask_kv)
        if TRACK:
            if t == track_step:
                tl.store(p_track, state.to(pool.dtype.element_ty), mask=mask_kv)
    if not VERIFY:
        tl.debug_barrier()  # every thread's initial load is done before any thread overwrites the tile
        tl.store(p_state, state.to(pool.dtype.element_ty), mask=mask_kv)


def fused_recurrent_gdn(
    q: torch.Tensor,  # [B, T, HQ, Dk] L2-normalised; HQ divides H (grouped heads)
    k: torch.Tensor,  # [B, T, HQ, Dk] L2-normalised
    v: torch.Tensor,  # [B, T, H, Dv]
    g: torch.Tensor,  # [B, T, H] log-decay
    beta: torch.Tensor,  # [B, T, H]
    state_pool: torch.Tensor,  # [N, H, Dk, Dv] fp32, one layer
    slots: torch.Tensor,  # [B] int, any stride
    scale: float,
    intermediate: torch.Tensor | None = None,  # [B, T, H, Dk, Dv]: verify mode
    *,
    track_slots: torch.Tensor | None = None,  # [B] int: extend checkpoint slots (decode/extend mode)
    track_steps: torch.Tensor | None = None,  # [B] int: step whose state each gets, < 0 for none
    block_v: int | None = None,
) -> torch.Tensor:
    """The delta rule over T tokens for states in `state_pool[slots]`; returns o [B, T, H, Dv] in v's dtype.

    Decode mode advances the pool states in place (and checkpoints `track_steps` into
    `track_slots`); verify mode leaves the pool untouched and writes the state after every
    step to `intermediate`.
    """
    B, T, HQ, DK = q.shape
    H, DV = v.shape[2], v.shape[3]
    assert k.shape == q.shape and v.shape[:2] == (B, T), "q/k/v shapes disagree"
    assert g.shape == (B, T, H) and beta.shape == (B, T, H), "g and beta must be [B, T, H]"
    assert H % HQ == 0, f"value heads {H} not a multiple of q/k heads {HQ}"
    assert state_pool.shape[1:] == (H, DK, DV), f"state pool {tuple(state_pool.shape)} vs {(H, DK, DV)}"
    check_slots(slots, B, state_pool.shape[0])
    o = torch.empty_like(v, memory_format=torch.contiguous_format)
    if B == 0 or T == 0:
        return o
    verify = intermediate is not None
    if verify:
        assert intermediate.shape == (B, T, H, DK, DV), f"intermediate {tuple(intermediate.shape)}"
    track = track_steps is not None
    assert not (track and verify), "verify mode commits through state_scatter, not track_steps"
    if track:
        assert track_slots is not None and track_slots.shape == (B,) and track_steps.shape == (B,)
        check_slots(track_slots, B, state_pool.shape[0])
        track_slots, track_steps = track_slots.contiguous(), track_steps.contiguous()
    else:
        track_slots = track_steps = slots  # placeholder pointers; unused without TRACK
    inter = intermediate if verify else state_pool  # placeholder pointer; unused in decode mode
    si = intermediate.stride() if verify else (0, 0, 0, 0, 0)

    BK = triton.next_power_of_2(DK)
    # Small V-blocks give small batches enough programs to fill the SMs; bigger ones cut q/k reloads.
    BV = block_v or min(triton.next_power_of_2(DV), 8 if B * H < 256 else 32)
    grid = (triton.cdiv(DV, BV), B * H)
    _gdn_recurrent_kernel[grid](
        q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous(), o,
        state_pool, slots, inter, track_slots, track_steps,
        float(scale), T, slots.stride(0),
        *state_pool.stride(), *si,
        H=H, HQ=HQ, DK=DK, DV=DV, BK=BK, BV=BV, VERIFY=verify, TRACK=track,
        num_warps=1 if BV <= 8 else 4,
    )
    return o


