"""Triton kernels vs their torch references in the bf16 engine's layout (--dtype bfloat16): compiled on a GPU, else in
the interpreter.

With `--dtype bfloat16` the recurrent pool, the conv-window pool and both verify
intermediates are bf16 (docs/engine.md). Both sides compute in fp32 and round once
per store, so stored states and outputs agree to within one bf16 ulp (the order of
fp32 sums differs); conv windows and the post-verify scatter are copies: exact.
"""

import pytest
import torch
import torch.nn.functional as F

from engine import kernels
from engine.kernels import conv_triton, gdn_triton
from engine.kernels.conv_naive import causal_conv1d_verify
from engine.kernels.gdn_naive import gdn_verify
from engine.kernels.state_scatter_naive import state_scatter_naive
from engine.kernels.state_scatter_triton import state_scatter_triton
from tests.engine.kernels.device import DEVICE, on_device

BF = torch.bfloat16
POOL_SIZE = 9
SLOTS = torch.tensor([7, 0, 2, 5, 4, 1], device=DEVICE)[::2]  # [3] non-contiguous, unordered: slots 7, 2, 4


def ulps(a: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest |a - ref| in bf16 ulps of the larger magnitude (0 where both are 0)."""
    a, ref = a.float(), ref.float()
    _, exp = torch.frexp(torch.maximum(a.abs(), ref.abs()))
    ulp = torch.ldexp(torch.ones_like(a), exp - 8)  # bf16 keeps 8 significant bits: m * 2^e, m in [0.5, 1)
    return ((a - ref).abs() / ulp).nan_to_num(0.0).max().item()


def _gdn_inputs(B, T, H, Dk, Dv, seed, input_dtype=BF):
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, T, H, Dk, generator=gen), dim=-1)
    k = F.normalize(torch.randn(B, T, H, Dk, generator=gen), dim=-1)
    v = torch.randn(B, T, H, Dv, generator=gen)
    g = -F.softplus(torch.randn(B, T, H, generator=gen)) * 0.5
    beta = torch.sigmoid(torch.randn(B, T, H, generator=gen))
    pool = (torch.randn(POOL_SIZE, H, Dk, Dv, generator=gen) * 0.1).to(BF)  # a bf16 state pool
    return on_device(*(x.to(input_dtype) for x in (q, k, v, g, beta))), pool.to(DEVICE)


# (B, T, H, Dk, Dv, block_v): masked tails in Dk (12 -> 16) and Dv (10 over blocks of 4)
SHAPES = [(3, 8, 2, 12, 10, 4), (3, 1, 2, 8, 6, None)]


@pytest.mark.parametrize("shape", SHAPES)
def test_gdn_verify_bf16_inputs_bf16_intermediate(shape):
    B, T, H, Dk, Dv, block_v = shape
    (q, k, v, g, beta), pool = _gdn_inputs(B, T, H, Dk, Dv, seed=T)
    before = pool.clone()
    inter = torch.full((B, T, H, Dk, Dv), float("nan"), dtype=BF, device=DEVICE)
    o = gdn_triton.fused_recurrent_gdn(q, k, v, g, beta, pool, SLOTS, Dk**-0.5, inter, block_v=block_v)
    o_ref, states_ref = gdn_verify(q, k, v, g, beta, before[SLOTS], Dk**-0.5)
    assert o.dtype == BF and inter.dtype == BF
    assert ulps(o, o_ref) <= 1 and ulps(inter, states_ref.to(BF)) <= 1
    assert torch.equal(pool, before)


@pytest.mark.parametrize("shape", SHAPES)
def test_gdn_decode_bf16_pool_rounds_once_at_the_end(shape):
    B, T, H, Dk, Dv, block_v = shape
    (q, k, v, g, beta), pool = _gdn_inputs(B, T, H, Dk, Dv, seed=20 + T)
    before = pool.clone()
    o = gdn_triton.fused_recurrent_gdn(q, k, v, g, beta, pool, SLOTS, 0.3, block_v=block_v)
    o_ref, states_ref = gdn_verify(q, k, v, g, beta, before[SLOTS], 0.3)
    assert pool.dtype == BF and ulps(o, o_ref) <= 1
    assert ulps(pool[SLOTS], states_ref[:, -1].to(BF)) <= 1  # fp32 for all T steps, one rounding
    others = [i for i in range(POOL_SIZE) if i not in SLOTS.tolist()]
    assert torch.equal(pool[others], before[others])


def _conv_inputs(B, T, C, K, seed):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(B, T, C, generator=gen) * 0.5).to(BF)
    weight = (torch.randn(C, K, generator=gen) * 0.3).to(BF)
    pool = (torch.randn(POOL_SIZE, C, K - 1, generator=gen) * 0.5).to(BF)  # a bf16 window pool: raw inputs
    return on_device(x, weight, pool)


# (B, T, C, K, block_c): T = 1, 2 < K - 1, T > K; C tails
CONV_SHAPES = [(3, 1, 10, 4, 4), (3, 2, 10, 4, 4), (3, 8, 6, 4, None)]


@pytest.mark.parametrize("shape", CONV_SHAPES)
def test_conv_bf16_pool_both_modes(shape):
    B, T, C, K, block_c = shape
    x, weight, pool = _conv_inputs(B, T, C, K, seed=T)
    before = pool.clone()
    inter = torch.zeros(B, T, C, K - 1, dtype=BF, device=DEVICE)
    y = conv_triton.causal_conv1d_pool(x, pool, SLOTS, weight, inter, block_c=block_c)
    y_ref, windows_ref = causal_conv1d_verify(x, before[SLOTS], weight)
    assert y.dtype == y_ref.dtype == BF and ulps(y, y_ref) <= 1  # both: fp32 products and sum, one rounding
    assert torch.equal(inter, windows_ref) and torch.equal(pool, before)  # windows are copies of inputs
    y_dec = conv_triton.causal_conv1d_pool(x, pool, SLOTS, weight, block_c=block_c)
    assert torch.equal(y_dec, y) and torch.equal(pool[SLOTS], windows_ref[:, -1])


def test_state_scatter_bf16_pools_are_exact_copies():
    L, B, T, H, Dk, Dv, C, KW = 2, 3, 4, 2, 3, 5, 7, 3
    gen = torch.Generator().manual_seed(5)
    rec_pool, conv_pool = on_device(*(torch.randn(L, POOL_SIZE, *s, generator=gen).to(BF)
                                      for s in ((H, Dk, Dv), (C, KW))))
    rec_inter, conv_inter = on_device(*(torch.randn(L, B, T, *s, generator=gen).to(BF) for s in ((H, Dk, Dv), (C, KW))))
    idx = on_device(torch.tensor([7, 2, 4]), torch.tensor([3, 0, 1]), torch.tensor([8, 3, 6]), torch.tensor([2, -1, 0]))
    rec_ref, conv_ref = rec_pool.clone(), conv_pool.clone()
    state_scatter_triton(rec_pool, conv_pool, rec_inter, conv_inter, *idx, block=16)
    state_scatter_naive(rec_ref, conv_ref, rec_inter, conv_inter, *idx)
    assert torch.equal(rec_pool, rec_ref) and torch.equal(conv_pool, conv_ref)
    assert torch.equal(rec_pool[:, 7], rec_inter[:, 0, 3]) and torch.equal(conv_pool[:, 6], conv_inter[:, 2, 0])


def test_dispatch_in_the_engines_bf16_layout(monkeypatch):
    """What the bf16 engine passes (fp32 q/k/v/g/beta from the layer, bf16 pools and intermediates), through the
    dispatch, for verify + commit, decode and extend: Triton and the torch references agree within one bf16 ulp,
    conv windows exactly."""
    gen = torch.Generator().manual_seed(1)
    B, T, H, D, C, K = 2, 8, 2, 8, 6, 4
    (q, k, v, g, beta), _ = _gdn_inputs(B, T, H, D, D, seed=9, input_dtype=torch.float32)
    x, weight, slots, rec, conv = on_device(
        torch.randn(B, T, C, generator=gen).to(BF), torch.randn(C, K, generator=gen).to(BF), torch.tensor([3, 1]),
        (torch.randn(1, 5, H, D, D, generator=gen) * 0.1).to(BF), torch.randn(1, 5, C, K - 1, generator=gen).to(BF))

    def run():
        rec_pool, conv_pool = rec.clone(), conv.clone()
        rec_inter = torch.empty(1, B, T, H, D, D, dtype=BF, device=DEVICE)
        conv_inter = torch.empty(1, B, T, C, K - 1, dtype=BF, device=DEVICE)
        o = kernels.gdn_pool_forward(q, k, v, g, beta, rec_pool[0], slots, 0.5, rec_inter[0])
        y = kernels.conv_pool_forward(x, conv_pool[0], slots, weight, conv_inter[0])
        kernels.commit_verified_states(rec_pool, conv_pool, rec_inter, conv_inter, slots,
                                       *on_device(torch.tensor([5, 2]), torch.tensor([0, 4]), torch.tensor([3, -1])))
        # decode (T = 1) and extend (T = 8: the chunked form on the torch side) from the same pools on both sides
        rec_dec, conv_dec = rec.clone(), conv.clone()
        o_dec = kernels.gdn_pool_forward(q[:, :1], k[:, :1], v[:, :1], g[:, :1], beta[:, :1], rec_dec[0], slots, 0.5)
        y_dec = kernels.conv_pool_forward(x[:, :1], conv_dec[0], slots, weight)
        rec_ext, conv_ext = rec.clone(), conv.clone()
        o_ext = kernels.gdn_pool_forward(q, k, v, g, beta, rec_ext[0], slots, 0.5)
        y_ext = kernels.conv_pool_forward(x, conv_ext[0], slots, weight)
        return dict(o=o, y=y, rec_pool=rec_pool, conv_pool=conv_pool, rec_inter=rec_inter, conv_inter=conv_inter,
                    o_dec=o_dec, y_dec=y_dec, rec_dec=rec_dec, conv_dec=conv_dec, o_ext=o_ext, y_ext=y_ext,
                    rec_ext=rec_ext, conv_ext=conv_ext)

    monkeypatch.setattr(kernels, "use_triton", lambda t: False)  # on a GPU too: the torch references
    reference = run()
    monkeypatch.setattr(kernels, "use_triton", lambda t: True)
    triton_out = run()
    for name in reference:
        assert triton_out[name].dtype == reference[name].dtype
        assert ulps(triton_out[name], reference[name]) <= 1, name
    for name in ("conv_inter", "conv_pool", "conv_dec", "conv_ext"):
        assert torch.equal(triton_out[name], reference[name]), name
