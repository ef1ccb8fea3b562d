"""Triton kernel for the causal conv window of the Gated DeltaNet (reference: conv_naive.py).

It works on the conv-window pool directly (one layer, per-sequence slot indices)
and has the two modes of the torch reference: decode/extend shifts the pooled
windows in place; verify leaves them untouched and writes the window after every
step to `intermediate` for `state_scatter` to commit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.triton_jit import _sum, check_slots, jit


@jit
def _gather_frame(x_row, p_win, offs_c, mask_c, idx, mask_idx, C, sp_w, KW: tl.constexpr):
    """Columns `idx` of [window | x] for channels offs_c, as fp32 [BC, len(idx)]."""
    in_window = idx < KW
    m_win = mask_c[:, None] & (mask_idx & in_window)[None, :]
    m_x = mask_c[:, None] & (mask_idx & (idx >= KW))[None, :]
    # The window holds raw inputs, i.e. values in x's dtype (the reference casts it the same way).
    from_win = tl.load(p_win + idx[None, :] * sp_w, mask=m_win, other=0.0)
    from_win = from_win.to(x_row.dtype.element_ty).to(tl.float32)
    from_x = tl.load(x_row + (idx - KW)[None, :] * C + offs_c[:, None], mask=m_x, other=0.0)
    return from_win + from_x.to(tl.float32)


@jit
def _conv_window_kernel(
    x, y,  # contiguous [B, T, C]
    pool, slots, weight, inter,  # pool [N, C, KW]; slots [B]; weight [C, KW + 1]; inter [B, T, C, KW]
    T, C, slot_stride,
    sp_n, sp_c, sp_w,
    sw_c, sw_k,
    si_b, si_t, si_c, si_w,
    KW: tl.constexpr, BF: tl.constexpr, BW: tl.constexpr, BC: tl.constexpr, VERIFY: tl.constexpr,
):
    i_c = tl.program_id(0)
    i_b = tl.program_id(1)
    offs_c = i_c * BC + tl.arange(0, BC)
    mask_c = offs_c < C
    offs_f = tl.arange(0, BF)  # frame taps 0..KW
    mask_f = offs_f < KW + 1
    offs_w = tl.arange(0, BW)  # window columns 0..KW-1
    mask_w = offs_w < KW

    slot = tl.load(slots + i_b * slot_stride).to(tl.int64)
    p_win = pool + slot * sp_n + offs_c[:, None] * sp_c
    x_row = x + i_b.to(tl.int64) * T * C
    w = tl.load(weight + offs_c[:, None] * sw_c + offs_f[None, :] * sw_k,
                mask=mask_c[:, None] & mask_f[None, :], other=0.0).to(tl.float32)  # [BC, BF]
    p_inter = inter + i_b.to(tl.int64) * si_b + offs_c[:, None] * si_c + offs_w[None, :] * si_w
    for t in range(T):
        # token t's frame is columns t..t+KW of [window | x]
        frame = _gather_frame(x_row, p_win, offs_c, mask_c, t + offs_f, mask_f, C, sp_w, KW)
        acc = _sum(frame * w, 1)  # [BC]
        out = acc / (1.0 + tl.exp(-acc))  # SiLU
        tl.store(y + (i_b.to(tl.int64) * T + t) * C + offs_c, out.to(y.dtype.element_ty), mask=mask_c)
        if VERIFY:
            win = _gather_frame(x_row, p_win, offs_c, mask_c, t + 1 + offs_w, mask_w, C, sp_w, KW)
            tl.store(p_inter + t * si_t, win.to(inter.dtype.element_ty),
                     mask=mask_c[:, None] & mask_w[None, :])
    if not VERIFY:
        win = _gather_frame(x_row, p_win, offs_c, mask_c, T + offs_w, mask_w, C, sp_w, KW)
        tl.debug_barrier()  # the new window may come from old window columns another thread reads
        tl.store(p_win + offs_w[None, :] * sp_w, win.to(pool.dtype.element_ty),
                 mask=mask_c[:, None] & mask_w[None, :])


def causal_conv1d_pool(
    x: torch.Tensor,  # [B, T, C]
    conv_pool: torch.Tensor,  # [N, C, K-1] the last K-1 raw inputs per slot
    slots: torch.Tensor,  # [B] int, any stride
    weight: torch.Tensor,  # [C, K] depthwise
    intermediate: torch.Tensor | None = None,  # [B, T, C, K-1]: verify mode
    *,
    block_c: int | None = None,
) -> torch.Tensor:
    """SiLU(depthwise causal conv) continuing from `conv_pool[slots]`; returns y [B, T, C] in x's dtype.

    Decode mode shifts the pooled windows in place; verify mode leaves them untouched and
    writes the window after every step to `intermediate`.
    """
    B, T, C = x.shape
    K = weight.shape[1]
    KW = K - 1
    assert K >= 2 and weight.shape == (C, K), f"weight {tuple(weight.shape)} for {C} channels"
    assert conv_pool.shape[1:] == (C, KW), f"conv pool {tuple(conv_pool.shape)} vs {(C, KW)}"
    check_slots(slots, B, conv_pool.shape[0])
    x = x.contiguous()
    y = torch.empty_like(x)
    if B == 0 or T == 0:
        return y
    verify = intermediate is not None
    if verify:
        assert intermediate.shape == (B, T, C, KW), f"intermediate {tuple(intermediate.shape)}"
    inter = intermediate if verify else conv_pool  # placeholder pointer; unused in decode mode
    si = intermediate.stride() if verify else (0, 0, 0, 0)

    BC = block_c or min(triton.next_power_of_2(C), 256)
    grid = (triton.cdiv(C, BC), B)
    _conv_window_kernel[grid](
        x, y, conv_pool, slots, weight, inter,
        T, C, slots.stride(0),
        *conv_pool.stride(), *weight.stride(), *si,
        KW=KW, BF=triton.next_power_of_2(K), BW=triton.next_power_of_2(KW), BC=BC, VERIFY=verify,
        num_warps=4,
    )
    return y
