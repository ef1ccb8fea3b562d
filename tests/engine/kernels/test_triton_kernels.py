"""Triton kernels vs their torch references: compiled on a GPU, else in Triton's interpreter on CPU tensors
(tiny shapes).

The dispatch only picks Triton for CUDA tensors, so these call the kernels directly.
Shapes are chosen so every masked tail is hit: Dk and Dv not powers of two, Dv and C
not multiples of the block, T below and above the conv window length.
"""

import pytest
import torch
import torch.nn.functional as F

from engine.kernels import conv_triton, gdn_triton, triton_jit
from engine.kernels.conv_naive import causal_conv1d_verify
from engine.kernels.gdn_naive import gdn_verify
from engine.kernels.state_scatter_naive import state_scatter_naive
from engine.kernels.state_scatter_triton import state_scatter_triton
from tests.engine.kernels.device import DEVICE, on_device

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
POOL_SIZE = 9
SLOTS = torch.tensor([7, 0, 2, 5, 4, 1], device=DEVICE)[::2]  # [3] non-contiguous, unordered: slots 7, 2, 4


def _gdn_inputs(B, T, HQ, H, Dk, Dv, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, T, HQ, Dk, generator=gen), dim=-1)
    k = F.normalize(torch.randn(B, T, HQ, Dk, generator=gen), dim=-1)
    v = torch.randn(B, T, H, Dv, generator=gen)
    g = -F.softplus(torch.randn(B, T, H, generator=gen)) * 0.5
    beta = torch.sigmoid(torch.randn(B, T, H, generator=gen))
    pool = torch.randn(POOL_SIZE, H, Dk, Dv, generator=gen) * 0.1  # fp32 states
    return on_device(*(x.to(dtype) for x in (q, k, v, g, beta))), pool.to(DEVICE)


def _gdn_reference(q, k, v, g, beta, state, scale):
    """gdn_verify with grouped q/k heads expanded to the value heads."""
    rep = v.shape[2] // q.shape[2]
    q, k = q.repeat_interleave(rep, dim=2), k.repeat_interleave(rep, dim=2)
    return gdn_verify(q, k, v, g, beta, state, scale)


def _err(a, b):
    return (a.float() - b.float()).abs().max().item()


# (B, T, HQ, H, Dk, Dv, block_v): tails in Dk (12 -> 16) and Dv (10 over blocks of 4); grouped heads
GDN_SHAPES = [(3, 3, 2, 2, 12, 10, 4), (3, 1, 1, 2, 8, 6, None), (3, 5, 1, 2, 5, 3, 2)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", GDN_SHAPES)
def test_gdn_verify_mode_writes_every_step_and_leaves_pool_untouched(shape, dtype):
    B, T, HQ, H, Dk, Dv, block_v = shape
    (q, k, v, g, beta), pool = _gdn_inputs(B, T, HQ, H, Dk, Dv, dtype, seed=T)
    pool_before = pool.clone()
    inter = torch.full((B, T, H, Dk, Dv), float("nan"), device=DEVICE)
    o = gdn_triton.fused_recurrent_gdn(q, k, v, g, beta, pool, SLOTS, Dk**-0.5, inter, block_v=block_v)
    o_ref, states_ref = _gdn_reference(q, k, v, g, beta, pool_before[SLOTS], Dk**-0.5)
    assert o.dtype == dtype and o.shape == (B, T, H, Dv)
    assert _err(o, o_ref) <= TOL[dtype]
    assert _err(inter, states_ref) <= TOL[dtype]
    assert torch.equal(pool, pool_before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", GDN_SHAPES)
def test_gdn_decode_mode_advances_only_its_slots(shape, dtype):
    B, T, HQ, H, Dk, Dv, block_v = shape
    (q, k, v, g, beta), pool = _gdn_inputs(B, T, HQ, H, Dk, Dv, dtype, seed=10 + T)
    pool_before = pool.clone()
    o = gdn_triton.fused_recurrent_gdn(q, k, v, g, beta, pool, SLOTS, 0.3, block_v=block_v)
    o_ref, states_ref = _gdn_reference(q, k, v, g, beta, pool_before[SLOTS], 0.3)
    assert _err(o, o_ref) <= TOL[dtype]
    assert pool.dtype == torch.float32
    assert _err(pool[SLOTS], states_ref[:, -1]) <= TOL[dtype]
    others = [i for i in range(POOL_SIZE) if i not in SLOTS.tolist()]
    assert torch.equal(pool[others], pool_before[others])


def test_gdn_decode_steps_chain_like_one_verify_block():
    """T decode calls of one token end where a T-token call ends, and pass through its intermediates."""
    (q, k, v, g, beta), pool = _gdn_inputs(3, 4, 2, 2, 8, 8, torch.float32, seed=3)
    inter = torch.empty(3, 4, 2, 8, 8, device=DEVICE)
    o_block = gdn_triton.fused_recurrent_gdn(q, k, v, g, beta, pool, SLOTS, 0.5, inter)
    for t in range(4):
        o_t = gdn_triton.fused_recurrent_gdn(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], g[:, t:t + 1],
                                             beta[:, t:t + 1], pool, SLOTS, 0.5)
        assert _err(o_t[:, 0], o_block[:, t]) <= 1e-5
        assert _err(pool[SLOTS], inter[:, t]) <= 1e-5


@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16])
def test_gdn_extend_checkpoints_a_step_from_registers(pool_dtype):
    """track_steps[b] >= 0: that step's state lands in track_slots[b]; the working states end as without it."""
    B, T = 3, 6
    (q, k, v, g, beta), pool = _gdn_inputs(B, T, 2, 2, 12, 10, torch.float32, seed=7)
    pool = pool.to(pool_dtype)
    plain = pool.clone()
    track_slots = torch.tensor([8, 3, 6], device=DEVICE)
    track_steps = torch.tensor([2, -1, 5], device=DEVICE)  # request 1 does not checkpoint; request 2 at its last step
    o = gdn_triton.fused_recurrent_gdn(q, k, v, g, beta, pool, SLOTS, 0.4, track_slots=track_slots,
                                       track_steps=track_steps, block_v=4)
    o_plain = gdn_triton.fused_recurrent_gdn(q, k, v, g, beta, plain, SLOTS, 0.4, block_v=4)
    _, states_ref = _gdn_reference(q, k, v, g, beta, _pool_before(pool_dtype)[SLOTS].float(), 0.4)
    assert torch.equal(o, o_plain) and torch.equal(pool[SLOTS], plain[SLOTS])
    tol = TOL[torch.float32] if pool_dtype == torch.float32 else TOL[torch.bfloat16]
    assert _err(pool[8], states_ref[0, 2]) <= tol
    assert _err(pool[6], states_ref[2, 5]) <= tol
    assert torch.equal(pool[3], plain[3])  # request 1's track slot untouched


def _pool_before(pool_dtype):
    _, pool = _gdn_inputs(3, 6, 2, 2, 12, 10, torch.float32, seed=7)
    return pool.to(pool_dtype)


def test_gdn_empty_block_is_a_no_op():
    (q, k, v, g, beta), pool = _gdn_inputs(3, 0, 2, 2, 8, 8, torch.float32, seed=0)
    before = pool.clone()
    o = gdn_triton.fused_recurrent_gdn(q, k, v, g, beta, pool, SLOTS, 0.5)
    assert o.shape == (3, 0, 2, 8) and torch.equal(pool, before)


def _conv_inputs(B, T, C, K, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(B, T, C, generator=gen) * 0.5).to(dtype)
    weight = (torch.randn(C, K, generator=gen) * 0.3).to(dtype)  # |y| < 2, where a bf16 ulp is 2**-7
    # windows hold raw inputs, so in a bf16 model they are bf16 values kept in fp32
    pool = (torch.randn(POOL_SIZE, C, K - 1, generator=gen) * 0.5).to(dtype).float()
    return on_device(x, weight, pool)


# (B, T, C, K, block_c): T = 1, 2 < K - 1 (the new window is partly the old one), T > K; C tails
CONV_SHAPES = [(3, 1, 10, 4, 4), (3, 2, 10, 4, 4), (3, 5, 6, 3, None), (3, 6, 5, 4, 2)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", CONV_SHAPES)
def test_conv_verify_mode_writes_every_window_and_leaves_pool_untouched(shape, dtype):
    B, T, C, K, block_c = shape
    x, weight, pool = _conv_inputs(B, T, C, K, dtype, seed=T)
    pool_before = pool.clone()
    inter = torch.full((B, T, C, K - 1), float("nan"), device=DEVICE)
    y = conv_triton.causal_conv1d_pool(x, pool, SLOTS, weight, inter, block_c=block_c)
    y_ref, windows_ref = causal_conv1d_verify(x, pool_before[SLOTS], weight)
    assert y.dtype == dtype and y.shape == (B, T, C)
    assert _err(y, y_ref) <= TOL[dtype]
    assert torch.equal(inter, windows_ref.float())  # windows are copies of inputs: exact
    assert torch.equal(pool, pool_before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", CONV_SHAPES)
def test_conv_decode_mode_shifts_only_its_windows(shape, dtype):
    B, T, C, K, block_c = shape
    x, weight, pool = _conv_inputs(B, T, C, K, dtype, seed=20 + T)
    pool_before = pool.clone()
    y = conv_triton.causal_conv1d_pool(x, pool, SLOTS, weight, block_c=block_c)
    y_ref, windows_ref = causal_conv1d_verify(x, pool_before[SLOTS], weight)
    assert _err(y, y_ref) <= TOL[dtype]
    assert torch.equal(pool[SLOTS], windows_ref[:, -1].float())
    others = [i for i in range(POOL_SIZE) if i not in SLOTS.tolist()]
    assert torch.equal(pool[others], pool_before[others])


def _scatter_case(index_dtype, seed):
    L, B, T, H, Dk, Dv, C, KW = 2, 3, 4, 2, 3, 5, 7, 3  # entries of 30 and 21 elements: tails at block 16
    gen = torch.Generator().manual_seed(seed)
    rec_pool = torch.randn(L, POOL_SIZE, H, Dk, Dv, generator=gen)
    conv_pool = torch.randn(L, POOL_SIZE, C, KW, generator=gen)
    rec_inter = torch.randn(L, B, T, H, Dk, Dv, generator=gen)
    conv_inter = torch.randn(L, B, T, C, KW, generator=gen)
    working = torch.tensor([7, 0, 2, 0, 4, 0], dtype=index_dtype)[::2]  # non-contiguous
    commit_steps = torch.tensor([3, 0, 1], dtype=index_dtype)
    track_slots = torch.tensor([8, 9, 3, 9, 6, 9], dtype=index_dtype)[::2]
    track_steps = torch.tensor([2, -1, 0], dtype=index_dtype)  # request 1 tracks nothing
    return on_device(rec_pool, conv_pool, rec_inter, conv_inter, working, commit_steps, track_slots, track_steps)


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_state_scatter_matches_reference_for_all_layers(index_dtype):
    rec_pool, conv_pool, rec_inter, conv_inter, *idx = _scatter_case(index_dtype, seed=1)
    rec_ref, conv_ref = rec_pool.clone(), conv_pool.clone()
    rec_before, conv_before = rec_pool.clone(), conv_pool.clone()
    state_scatter_triton(rec_pool, conv_pool, rec_inter, conv_inter, *idx, block=16)
    state_scatter_naive(rec_ref, conv_ref, rec_inter, conv_inter, *idx)
    assert torch.equal(rec_pool, rec_ref) and torch.equal(conv_pool, conv_ref)
    # spelled out: commits, the one tracked checkpoint per tracking request, and nothing else
    for layer in range(2):
        assert torch.equal(rec_pool[layer, 7], rec_inter[layer, 0, 3])
        assert torch.equal(conv_pool[layer, 4], conv_inter[layer, 2, 1])
        assert torch.equal(rec_pool[layer, 8], rec_inter[layer, 0, 2])
        assert torch.equal(conv_pool[layer, 6], conv_inter[layer, 2, 0])
    untouched = [0, 1, 3, 5]
    assert torch.equal(rec_pool[:, untouched], rec_before[:, untouched])
    assert torch.equal(conv_pool[:, untouched], conv_before[:, untouched])


def test_state_scatter_all_skips_only_commits():
    rec_pool, conv_pool, rec_inter, conv_inter, working, commit_steps, track_slots, _ = _scatter_case(
        torch.int64, seed=2)
    before = rec_pool.clone()
    state_scatter_triton(rec_pool, conv_pool, rec_inter, conv_inter, working, commit_steps, track_slots,
                         torch.full((3,), -1, device=DEVICE))
    assert torch.equal(rec_pool[:, [8, 3, 6]], before[:, [8, 3, 6]])
    assert torch.equal(rec_pool[:, 2], rec_inter[:, 1, 0])


def test_kernels_run_in_the_interpreter_here():
    """Even with every test module collected in one process (no GPU here), the kernels are interpreted."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA device compiles the kernels")
    from triton.runtime.interpreter import InterpretedFunction

    from engine.kernels.state_scatter_triton import _state_scatter_kernel

    assert triton_jit.INTERPRET
    for kernel in (gdn_triton._gdn_recurrent_kernel, conv_triton._conv_window_kernel, _state_scatter_kernel):
        assert isinstance(kernel, InterpretedFunction)


def test_kernels_are_compiled_on_a_gpu():
    """With a CUDA device the kernels are built for it, never for the interpreter."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the kernels are interpreted (test_kernels_run_in_the_interpreter_here)")
    from triton.runtime.interpreter import InterpretedFunction

    from engine.kernels.state_scatter_triton import _state_scatter_kernel

    assert not triton_jit.INTERPRET
    for kernel in (gdn_triton._gdn_recurrent_kernel, conv_triton._conv_window_kernel, _state_scatter_kernel):
        assert not isinstance(kernel, InterpretedFunction)


def test_package_keeps_its_dispatch_function():
    """Loading the Triton scatter module must not shadow the dispatch function other code calls."""
    import engine.kernels

    assert callable(engine.kernels.commit_verified_states)


def test_gdn_and_scatter_accept_step_major_intermediates():
    """The runner's verify buffers are step-major views: the kernels address them by strides."""
    B, T, HQ, H, Dk, Dv, block_v = GDN_SHAPES[0]
    (q, k, v, g, beta), pool = _gdn_inputs(B, T, HQ, H, Dk, Dv, torch.float32, seed=11)
    dense = torch.full((B, T, H, Dk, Dv), float("nan"), device=DEVICE)
    step_major = torch.full((T, B, H, Dk, Dv), float("nan"), device=DEVICE).transpose(0, 1)
    outs = [gdn_triton.fused_recurrent_gdn(q, k, v, g, beta, pool, SLOTS, Dk**-0.5, inter, block_v=block_v)
            for inter in (dense, step_major)]
    assert torch.equal(outs[0], outs[1]) and torch.equal(dense, step_major)
    rec_pool, conv_pool, rec_inter, conv_inter, *idx = _scatter_case(torch.long, seed=2)
    results = []
    for layout in ("dense", "step-major"):
        r, c = rec_inter, conv_inter
        if layout == "step-major":
            r = rec_inter.transpose(1, 2).contiguous().transpose(1, 2)
            c = conv_inter.transpose(1, 2).contiguous().transpose(1, 2)
        rp, cp = rec_pool.clone(), conv_pool.clone()
        state_scatter_triton(rp, cp, r, c, *idx, block=16)
        results.append((rp, cp))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
