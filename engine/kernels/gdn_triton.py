"""Triton kernels for the Gated DeltaNet hot path: the fused recurrent delta rule and the conv window.

Both work on the linear-state pool directly (one layer, per-sequence slot
indices) and have the two modes of the torch references in `gdn_naive.py`:

* decode/extend (`intermediate is None`): the pool states advance in place;
* verify (`intermediate` given): the pool is read, never written, and the state
  after every block step goes to `intermediate` for `state_scatter` to commit.

The recurrent kernel's grid is (V-blocks, batch x value-heads): each program
keeps one [Dk, BV] fp32 state tile in registers for all T steps, so the state
crosses memory once in and once out (decode) or once per step (verify).
Without a CUDA device the kernels are built for Triton's interpreter, which
runs them on CPU tensors (how the tests exercise them).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Triton reads TRITON_INTERPRET when a function is decorated, not when it runs. On a
# machine without CUDA the interpreter is the only way the kernels can run at all, so
# build them for it even if the variable was not set before this module was imported.
INTERPRET = bool(triton.knobs.runtime.interpret) or not torch.cuda.is_available()


def jit(fn):
    """`triton.jit`, built for the interpreter when INTERPRET (shared by state_scatter.py)."""
    if not INTERPRET:
        return triton.jit(fn)
    with triton.knobs.runtime.scope():
        triton.knobs.runtime.interpret = True
        return triton.jit(fn)


@jit
def _sum(x, axis: tl.constexpr):
    """tl.sum without its standard-library wrapper, which works in the interpreter only when
    TRITON_INTERPRET was set before triton itself was imported; tl.reduce is a builtin."""
    return tl.reduce(x, axis, tl.standard._sum_combine)


@jit
def _gdn_recurrent_kernel(
    q, k, v, g, beta,  # contiguous [B, T, HQ, DK] x2, [B, T, H, DV], [B, T, H] x2
    o,  # [B, T, H, DV]
    pool, slots, inter,  # pool [N, H, DK, DV]; slots [B]; inter [B, T, H, DK, DV] (verify only)
    scale, T, slot_stride,
    sp_n, sp_h, sp_k, sp_v,
    si_b, si_t, si_h, si_k, si_v,
    H: tl.constexpr, HQ: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, VERIFY: tl.constexpr,
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
    if not VERIFY:
        tl.debug_barrier()  # every thread's initial load is done before any thread overwrites the tile
        tl.store(p_state, state.to(pool.dtype.element_ty), mask=mask_kv)


def _check_slots(slots: torch.Tensor, batch: int, pool_size: int) -> None:
    assert slots.dim() == 1 and slots.shape[0] == batch, f"slots {tuple(slots.shape)} for batch {batch}"
    assert not slots.is_floating_point(), "slots must be integer"
    assert pool_size > 0


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
    block_v: int | None = None,
) -> torch.Tensor:
    """The delta rule over T tokens for states in `state_pool[slots]`; returns o [B, T, H, Dv] in v's dtype.

    Decode mode advances the pool states in place; verify mode leaves the pool untouched
    and writes the state after every step to `intermediate`.
    """
    B, T, HQ, DK = q.shape
    H, DV = v.shape[2], v.shape[3]
    assert k.shape == q.shape and v.shape[:2] == (B, T), "q/k/v shapes disagree"
    assert g.shape == (B, T, H) and beta.shape == (B, T, H), "g and beta must be [B, T, H]"
    assert H % HQ == 0, f"value heads {H} not a multiple of q/k heads {HQ}"
    assert state_pool.shape[1:] == (H, DK, DV), f"state pool {tuple(state_pool.shape)} vs {(H, DK, DV)}"
    _check_slots(slots, B, state_pool.shape[0])
    o = torch.empty_like(v, memory_format=torch.contiguous_format)
    if B == 0 or T == 0:
        return o
    verify = intermediate is not None
    if verify:
        assert intermediate.shape == (B, T, H, DK, DV), f"intermediate {tuple(intermediate.shape)}"
    inter = intermediate if verify else state_pool  # placeholder pointer; unused in decode mode
    si = intermediate.stride() if verify else (0, 0, 0, 0, 0)

    BK = triton.next_power_of_2(DK)
    # Small V-blocks give small batches enough programs to fill the SMs; bigger ones cut q/k reloads.
    BV = block_v or min(triton.next_power_of_2(DV), 8 if B * H < 256 else 32)
    grid = (triton.cdiv(DV, BV), B * H)
    _gdn_recurrent_kernel[grid](
        q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous(), o,
        state_pool, slots, inter,
        float(scale), T, slots.stride(0),
        *state_pool.stride(), *si,
        H=H, HQ=HQ, DK=DK, DV=DV, BK=BK, BV=BV, VERIFY=verify,
        num_warps=1 if BV <= 8 else 4,
    )
    return o


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
    _check_slots(slots, B, conv_pool.shape[0])
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
